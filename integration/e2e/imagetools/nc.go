package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"
)

func errorsAs(err error, target any) bool { return errors.As(err, target) }

// nc [-v] [-t|-u] [-z] [-w SECONDS] [-p SRCPORT] HOST PORT: a client only.
// Sends stdin, prints what comes back until the peer closes or, with -w (and
// always for UDP), until nothing arrived for SECONDS.
func nc(args []string) int {
	udp, verbose, zero := false, false, false
	wait := time.Duration(0)
	srcPort := 0
	var pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if len(a) > 1 && a[0] == '-' {
			for j := 1; j < len(a); j++ {
				switch a[j] {
				case 'v':
					verbose = true
				case 't':
					udp = false
				case 'u':
					udp = true
				case 'z':
					zero = true
				case 'w', 'p':
					v := a[j+1:]
					if v == "" {
						if i+1 == len(args) {
							return usage("nc", "-%c needs a value", a[j])
						}
						i++
						v = args[i]
					}
					n, err := strconv.Atoi(v)
					if err != nil {
						return usage("nc", "-%c %q: not a number", a[j], v)
					}
					if a[j] == 'w' {
						wait = time.Duration(n) * time.Second
					} else {
						srcPort = n
					}
					j = len(a)
				default:
					return usage("nc", "unsupported flag -%c (a client only: -v -t -u -z -w -p)", a[j])
				}
			}
			continue
		}
		pos = append(pos, a)
	}
	if len(pos) != 2 {
		return usage("nc", "want HOST PORT")
	}
	network := "tcp"
	if udp {
		network = "udp"
	}
	d := net.Dialer{Timeout: wait}
	if srcPort != 0 {
		if udp {
			d.LocalAddr = &net.UDPAddr{Port: srcPort}
		} else {
			d.LocalAddr = &net.TCPAddr{Port: srcPort}
		}
	}
	addr := net.JoinHostPort(pos[0], pos[1])
	conn, err := d.Dial(network, addr)
	if err != nil {
		if verbose {
			fmt.Fprintf(os.Stderr, "nc: connect to %s (%s) failed: %v\n", addr, network, err)
		}
		return 1
	}
	defer conn.Close()
	if verbose {
		fmt.Fprintf(os.Stderr, "Connection to %s %s port [%s] succeeded!\n", pos[0], pos[1], network)
	}
	if zero {
		return 0
	}
	if udp && wait == 0 {
		wait = 2 * time.Second
	}
	sent := make(chan struct{})
	go func() {
		io.Copy(conn, os.Stdin) //nolint:errcheck // the peer may close first
		if tc, ok := conn.(*net.TCPConn); ok {
			tc.CloseWrite() //nolint:errcheck
		}
		close(sent)
	}()
	buf := make([]byte, 64<<10)
	for {
		if wait > 0 {
			conn.SetReadDeadline(time.Now().Add(wait)) //nolint:errcheck
		}
		n, err := conn.Read(buf)
		os.Stdout.Write(buf[:n]) //nolint:errcheck
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return 0 // quiet for -w seconds: done, as nc -w
			}
			if err == io.EOF {
				return 0
			}
			if udp {
				return 1 // ICMP port unreachable
			}
			return 0
		}
	}
}
