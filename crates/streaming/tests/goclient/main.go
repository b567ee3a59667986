// Command goclient drives hpk-streaming with the real client-go streaming clients, so the
// Rust tests check the server against what kubectl and crictl use.
//
//	goclient exec-spdy URL [-stdin] [-tty] [-resize WxH]
//	goclient exec-ws URL [-protocol P] [-stdin] [-tty] [-resize WxH]
//	goclient portforward URL PORT BYTES          (SPDY; echo check through a local listener)
//	goclient portforward-ws URL PORT BYTES       (SPDY tunnelled in WebSocket)
//	goclient portforward-refused URL BADPORT GOODPORT  (one SPDY connection: error, then data)
//
// Exit codes: the remote command's exit code for exec; 0 success; 90 usage; 91 other errors.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/transport/spdy"
	"k8s.io/client-go/util/exec"
)

func fail(code int, format string, args ...any) {
	fmt.Fprintf(os.Stderr, "goclient: "+format+"\n", args...)
	os.Exit(code)
}

type oneSize struct {
	size *remotecommand.TerminalSize
}

func (q *oneSize) Next() *remotecommand.TerminalSize {
	if q.size == nil {
		// Block: a nil return ends resizing, the session goes on.
		time.Sleep(time.Hour)
		return nil
	}
	s := q.size
	q.size = nil
	return s
}

func runExec(mode string, args []string) {
	fs := flag.NewFlagSet(mode, flag.ExitOnError)
	stdin := fs.Bool("stdin", false, "send os.Stdin")
	tty := fs.Bool("tty", false, "tty mode")
	resize := fs.String("resize", "", "send one resize WxH")
	protocol := fs.String("protocol", "", "websocket subprotocol (default: client-go's)")
	if len(args) < 1 {
		fail(90, "usage: %s URL [flags]", mode)
	}
	u, err := url.Parse(args[0])
	if err != nil {
		fail(90, "bad url: %v", err)
	}
	if err := fs.Parse(args[1:]); err != nil {
		fail(90, "%v", err)
	}
	cfg := &rest.Config{}
	var ex remotecommand.Executor
	switch {
	case mode == "exec-spdy":
		ex, err = remotecommand.NewSPDYExecutor(cfg, "POST", u)
	case *protocol != "":
		ex, err = remotecommand.NewWebSocketExecutorForProtocols(cfg, "GET", u.String(), *protocol)
	default:
		ex, err = remotecommand.NewWebSocketExecutor(cfg, "GET", u.String())
	}
	if err != nil {
		fail(91, "executor: %v", err)
	}
	opts := remotecommand.StreamOptions{Stdout: os.Stdout, Tty: *tty}
	if !*tty {
		opts.Stderr = os.Stderr
	}
	if *stdin {
		opts.Stdin = os.Stdin
	}
	if *resize != "" {
		w, h, ok := strings.Cut(*resize, "x")
		wi, _ := strconv.Atoi(w)
		hi, _ := strconv.Atoi(h)
		if !ok || wi <= 0 || hi <= 0 {
			fail(90, "bad -resize %q", *resize)
		}
		opts.TerminalSizeQueue = &oneSize{&remotecommand.TerminalSize{Width: uint16(wi), Height: uint16(hi)}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err = ex.StreamWithContext(ctx, opts)
	var exitErr exec.CodeExitError
	switch {
	case err == nil:
		os.Exit(0)
	case errors.As(err, &exitErr):
		fmt.Fprintf(os.Stderr, "goclient: %v\n", err)
		os.Exit(exitErr.Code)
	default:
		fail(91, "stream: %v", err)
	}
}

func dialer(mode string, u *url.URL) httpstream.Dialer {
	cfg := &rest.Config{}
	if mode == "portforward-ws" {
		d, err := portforward.NewSPDYOverWebsocketDialer(u, cfg)
		if err != nil {
			fail(91, "tunneling dialer: %v", err)
		}
		return d
	}
	tr, up, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		fail(91, "round tripper: %v", err)
	}
	return spdy.NewDialer(up, &http.Client{Transport: tr}, "POST", u)
}

func echoCheck(conn net.Conn, n int) error {
	payload := make([]byte, n)
	if _, err := rand.Read(payload); err != nil {
		return err
	}
	go func() {
		_, _ = conn.Write(payload)
		if tc, ok := conn.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	got, err := io.ReadAll(conn)
	if err != nil {
		return fmt.Errorf("read echo: %w", err)
	}
	if !bytes.Equal(got, payload) {
		return fmt.Errorf("echo mismatch: sent %d bytes, got %d back", len(payload), len(got))
	}
	return nil
}

func runPortForward(mode string, args []string) {
	if len(args) != 3 {
		fail(90, "usage: %s URL PORT BYTES", mode)
	}
	u, err := url.Parse(args[0])
	if err != nil {
		fail(90, "bad url: %v", err)
	}
	n, err := strconv.Atoi(args[2])
	if err != nil {
		fail(90, "bad size: %v", err)
	}
	stop := make(chan struct{})
	ready := make(chan struct{})
	pf, err := portforward.NewOnAddresses(dialer(mode, u), []string{"127.0.0.1"}, []string{"0:" + args[1]}, stop, ready, io.Discard, os.Stderr)
	if err != nil {
		fail(91, "port forwarder: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- pf.ForwardPorts() }()
	select {
	case <-ready:
	case err := <-done:
		fail(91, "forward ports: %v", err)
	case <-time.After(30 * time.Second):
		fail(91, "port forwarder not ready")
	}
	ports, err := pf.GetPorts()
	if err != nil {
		fail(91, "ports: %v", err)
	}
	// Two connections one after the other on the same SPDY session.
	for i := 0; i < 2; i++ {
		conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", ports[0].Local))
		if err != nil {
			fail(91, "dial local: %v", err)
		}
		if err := echoCheck(conn, n); err != nil {
			fail(91, "connection %d: %v", i, err)
		}
		conn.Close()
	}
	close(stop)
	fmt.Println("OK")
}

// runRefused opens stream pairs by hand on one connection, as client-go's port forwarder
// does, to check that a refused port is reported on its error stream and the session lives on.
func runRefused(args []string) {
	if len(args) != 3 {
		fail(90, "usage: portforward-refused URL BADPORT GOODPORT")
	}
	u, err := url.Parse(args[0])
	if err != nil {
		fail(90, "bad url: %v", err)
	}
	conn, _, err := dialer("portforward", u).Dial(portforward.PortForwardProtocolV1Name)
	if err != nil {
		fail(91, "dial: %v", err)
	}
	defer conn.Close()
	pair := func(port string, id int) (httpstream.Stream, httpstream.Stream) {
		h := http.Header{}
		h.Set(v1.StreamType, v1.StreamTypeError)
		h.Set(v1.PortHeader, port)
		h.Set(v1.PortForwardRequestIDHeader, strconv.Itoa(id))
		errStream, err := conn.CreateStream(h)
		if err != nil {
			fail(91, "error stream: %v", err)
		}
		errStream.Close()
		h.Set(v1.StreamType, v1.StreamTypeData)
		data, err := conn.CreateStream(h)
		if err != nil {
			fail(91, "data stream: %v", err)
		}
		return errStream, data
	}
	errStream, data := pair(args[1], 0)
	msg, err := io.ReadAll(errStream)
	if err != nil {
		fail(91, "read error stream: %v", err)
	}
	fmt.Printf("ERROR: %s\n", msg)
	_ = data.Reset()

	errStream, data = pair(args[2], 1)
	payload := []byte("still alive after a refused port")
	if _, err := data.Write(payload); err != nil {
		fail(91, "write: %v", err)
	}
	data.Close()
	got, err := io.ReadAll(data)
	if err != nil {
		fail(91, "read data: %v", err)
	}
	if !bytes.Equal(got, payload) {
		fail(91, "echo mismatch: %q", got)
	}
	if msg, _ := io.ReadAll(errStream); len(msg) > 0 {
		fail(91, "unexpected error: %s", msg)
	}
	fmt.Println("OK")
}

func main() {
	if len(os.Args) < 2 {
		fail(90, "usage: goclient MODE ...")
	}
	mode, args := os.Args[1], os.Args[2:]
	switch mode {
	case "exec-spdy", "exec-ws":
		runExec(mode, args)
	case "portforward", "portforward-ws":
		runPortForward(mode, args)
	case "portforward-refused":
		runRefused(args)
	default:
		fail(90, "unknown mode %q", mode)
	}
}
