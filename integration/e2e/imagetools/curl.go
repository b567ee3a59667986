package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// curlOptions are the curl options the e2e suite passes.
type curlOptions struct {
	url, output, writeOut, method, iface string
	connectTimeout, maxTime              time.Duration
	insecure, verbose, include, head     bool
	follow, failHTTP, silent, showError  bool
}

// curl [-qsgkviILfS] [-X METHOD] [-o FILE] [-w FORMAT] [--connect-timeout S]
// [-m|--max-time S] [--interface IP] URL. Exit codes as curl's: 6 the host did
// not resolve, 7 no connection, 22 an HTTP error with -f, 28 timed out.
func curl(args []string) int {
	o, rc := parseCurl(args)
	if rc != 0 {
		return rc
	}
	ctx := context.Background()
	if o.maxTime > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.maxTime)
		defer cancel()
	}
	dialer := &net.Dialer{Timeout: o.connectTimeout}
	if o.iface != "" {
		ip := net.ParseIP(o.iface)
		if ip == nil {
			return usage("curl", "--interface %q: only an address is supported", o.iface)
		}
		dialer.LocalAddr = &net.TCPAddr{IP: ip}
	}
	client := &http.Client{Transport: &http.Transport{
		DialContext:       dialer.DialContext,
		DisableKeepAlives: true,
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: o.insecure}, //nolint:gosec // curl -k
	}}
	if !o.follow {
		client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	}
	req, err := http.NewRequestWithContext(ctx, o.method, o.url, nil)
	if err != nil {
		return usage("curl", "%v", err)
	}
	req.Header.Set("User-Agent", "curl/8 (hpk e2e stand-in)")
	resp, err := client.Do(req)
	if err != nil {
		return curlFailure(err, !o.silent || o.showError)
	}
	defer resp.Body.Close()
	if o.verbose {
		fmt.Fprintf(os.Stderr, "< %s %s\n", resp.Proto, resp.Status)
	}
	if o.failHTTP && resp.StatusCode >= 400 {
		fmt.Fprintf(os.Stderr, "curl: (22) The requested URL returned error: %d\n", resp.StatusCode)
		return 22
	}
	out := io.Writer(os.Stdout)
	if o.output != "" && o.output != "-" {
		f, err := os.Create(o.output)
		if err != nil {
			fmt.Fprintf(os.Stderr, "curl: %v\n", err)
			return 23
		}
		defer f.Close()
		out = f
	}
	if o.include || o.head {
		fmt.Fprintf(out, "%s %s\r\n", resp.Proto, resp.Status)
		resp.Header.Write(out) //nolint:errcheck
		fmt.Fprint(out, "\r\n")
	}
	if !o.head {
		if _, err := io.Copy(out, resp.Body); err != nil {
			return curlFailure(err, !o.silent || o.showError)
		}
	}
	if o.writeOut != "" {
		fmt.Print(strings.ReplaceAll(o.writeOut, "%{http_code}", fmt.Sprintf("%03d", resp.StatusCode)))
	}
	return 0
}

func parseCurl(args []string) (curlOptions, int) {
	o := curlOptions{method: http.MethodGet}
	// value returns the value of an option: the rest of a short-option cluster or the next argument.
	value := func(i *int, rest string) (string, bool) {
		if rest != "" {
			return rest, true
		}
		if *i+1 == len(args) {
			return "", false
		}
		*i++
		return args[*i], true
	}
	seconds := func(name, v string) (time.Duration, int) {
		secs, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, usage("curl", "%s %q: not a number of seconds", name, v)
		}
		return time.Duration(secs * float64(time.Second)), 0
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		var rc int
		switch {
		case strings.HasPrefix(a, "--"):
			name, inline, hasInline := strings.Cut(a, "=")
			rest := ""
			if hasInline {
				rest = inline
			}
			switch name {
			case "--silent", "--globoff", "--show-error", "--insecure", "--verbose", "--include", "--head", "--location", "--fail":
				o.setFlag(map[string]byte{"--silent": 's', "--globoff": 'g', "--show-error": 'S', "--insecure": 'k',
					"--verbose": 'v', "--include": 'i', "--head": 'I', "--location": 'L', "--fail": 'f'}[name])
			case "--output", "--write-out", "--request", "--interface", "--connect-timeout", "--max-time":
				v, ok := value(&i, rest)
				if !ok {
					return o, usage("curl", "%s needs a value", name)
				}
				switch name {
				case "--output":
					o.output = v
				case "--write-out":
					o.writeOut = v
				case "--request":
					o.method = v
				case "--interface":
					o.iface = v
				case "--connect-timeout":
					o.connectTimeout, rc = seconds(name, v)
				case "--max-time":
					o.maxTime, rc = seconds(name, v)
				}
			default:
				return o, usage("curl", "unsupported option %q", a)
			}
		case len(a) > 1 && a[0] == '-':
			for j := 1; j < len(a); j++ {
				c := a[j]
				switch c {
				case 'q', 's', 'g', 'S', 'k', 'v', 'i', 'I', 'L', 'f':
					o.setFlag(c)
				case 'X', 'o', 'w', 'm':
					v, ok := value(&i, a[j+1:])
					if !ok {
						return o, usage("curl", "-%c needs a value", c)
					}
					switch c {
					case 'X':
						o.method = v
					case 'o':
						o.output = v
					case 'w':
						o.writeOut = v
					case 'm':
						o.maxTime, rc = seconds("-m", v)
					}
					j = len(a)
				default:
					return o, usage("curl", "unsupported option -%c", c)
				}
			}
		default:
			if o.url != "" {
				return o, usage("curl", "more than one URL (%q)", a)
			}
			o.url = a
		}
		if rc != 0 {
			return o, rc
		}
	}
	if o.url == "" {
		return o, usage("curl", "no URL")
	}
	if !strings.Contains(o.url, "://") {
		o.url = "http://" + o.url
	}
	if o.head {
		o.method = http.MethodHead
	}
	return o, 0
}

func (o *curlOptions) setFlag(c byte) {
	switch c {
	case 'k':
		o.insecure = true
	case 'v':
		o.verbose = true
	case 'i':
		o.include = true
	case 'I':
		o.head = true
	case 'L':
		o.follow = true
	case 'f':
		o.failHTTP = true
	case 's':
		o.silent = true
	case 'S':
		o.showError = true
	}
	// q, g: nothing to do (no config file, no globbing).
}

// curlFailure maps err to curl's exit code, and says why on stderr unless told to be silent.
func curlFailure(err error, say bool) int {
	if say {
		fmt.Fprintf(os.Stderr, "curl: %v\n", err)
	}
	var dnsErr *net.DNSError
	switch {
	case errorsAs(err, &dnsErr):
		return 6
	case os.IsTimeout(err) || strings.Contains(err.Error(), "deadline exceeded") || strings.Contains(err.Error(), "timeout"):
		return 28
	default:
		return 7
	}
}
