package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"time"
)

// dig [+tcp|+notcp] [+noall] [+answer] [+search] [+short] NAME [A|AAAA|SRV|PTR|CNAME]
// through the resolver of /etc/resolv.conf (search list and ndots applied with
// +search, as dig does). Prints answer lines (or, with +short, the data only);
// prints nothing and exits 0 when the name has no such record, as dig does.
func dig(args []string) int {
	tcp, short, search := false, false, false
	var name, qtype string
	for _, a := range args {
		switch {
		case a == "+tcp" || a == "+vc":
			tcp = true
		case a == "+notcp" || a == "+novc":
			tcp = false
		case a == "+short":
			short = true
		case a == "+search":
			search = true
		case a == "+nosearch":
			search = false
		case strings.HasPrefix(a, "+"): // display options: +noall +answer +nocmd ...
		case name == "":
			name = a
		case qtype == "":
			qtype = strings.ToUpper(a)
		default:
			return usage("dig", "unsupported argument %q", a)
		}
	}
	if name == "" {
		return usage("dig", "no name")
	}
	if qtype == "" {
		qtype = "A"
	}
	if !search && !strings.HasSuffix(name, ".") {
		name += "."
	}
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		// A stream connection makes the Go resolver speak DNS over TCP.
		if tcp {
			network = "tcp"
		} else {
			network = "udp"
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var lines []string
	answer := func(owner, typ, data string) {
		if short {
			lines = append(lines, data)
		} else {
			lines = append(lines, fmt.Sprintf("%s\t30\tIN\t%s\t%s", fqdn(owner), typ, data))
		}
	}
	switch qtype {
	case "A", "AAAA":
		family := "ip4"
		if qtype == "AAAA" {
			family = "ip6"
		}
		ips, err := r.LookupIP(ctx, family, name)
		if err != nil && !notFound(err) {
			return digFailure(err)
		}
		for _, ip := range ips {
			answer(name, qtype, ip.String())
		}
	case "CNAME":
		cname, err := r.LookupCNAME(ctx, name)
		if err != nil && !notFound(err) {
			return digFailure(err)
		}
		if err == nil && cname != fqdn(name) {
			answer(name, "CNAME", cname)
		}
	case "SRV":
		_, srvs, err := r.LookupSRV(ctx, "", "", name)
		if err != nil && !notFound(err) {
			return digFailure(err)
		}
		for _, s := range srvs {
			answer(name, "SRV", fmt.Sprintf("%d %d %d %s", s.Priority, s.Weight, s.Port, s.Target))
		}
	case "PTR":
		ip := reverseToIP(name)
		if ip == "" {
			return usage("dig", "PTR: %q is not an in-addr.arpa or ip6.arpa name", name)
		}
		names, err := r.LookupAddr(ctx, ip)
		if err != nil && !notFound(err) {
			return digFailure(err)
		}
		for _, n := range names {
			answer(name, "PTR", n)
		}
	default:
		return usage("dig", "unsupported record type %q", qtype)
	}
	for _, l := range lines {
		fmt.Println(l)
	}
	return 0
}

func fqdn(name string) string {
	if strings.HasSuffix(name, ".") {
		return name
	}
	return name + "."
}

func notFound(err error) bool {
	dnsErr, ok := err.(*net.DNSError)
	return ok && dnsErr.IsNotFound
}

func digFailure(err error) int {
	fmt.Fprintf(os.Stderr, ";; %v\n", err)
	return 9 // dig: no reply from server
}

// reverseToIP turns 4.3.2.1.in-addr.arpa. (or a nibble ip6.arpa name) back
// into the address the Go resolver's LookupAddr wants.
func reverseToIP(name string) string {
	n := strings.TrimSuffix(strings.ToLower(name), ".")
	if s, ok := strings.CutSuffix(n, ".in-addr.arpa"); ok {
		p := strings.Split(s, ".")
		if len(p) != 4 {
			return ""
		}
		return p[3] + "." + p[2] + "." + p[1] + "." + p[0]
	}
	if s, ok := strings.CutSuffix(n, ".ip6.arpa"); ok {
		p := strings.Split(s, ".")
		if len(p) != 32 {
			return ""
		}
		var b strings.Builder
		for i := 31; i >= 0; i-- {
			b.WriteString(p[i])
			if i%4 == 0 && i > 0 {
				b.WriteByte(':')
			}
		}
		return b.String()
	}
	return ""
}

// getent hosts NAME...: /etc/hosts first, then DNS, as glibc's files+dns.
func getent(args []string) int {
	if len(args) < 2 || args[0] != "hosts" {
		return usage("getent", "only `getent hosts NAME...`")
	}
	rc := 0
	for _, name := range args[1:] {
		if line := hostsFileEntry(name); line != "" {
			fmt.Println(line)
			continue
		}
		ips, err := net.LookupIP(name)
		if err != nil || len(ips) == 0 {
			rc = 2 // getent: key not found
			continue
		}
		for _, ip := range ips {
			fmt.Printf("%-15s %s\n", ip, name)
		}
	}
	return rc
}

func hostsFileEntry(name string) string {
	f, err := os.Open("/etc/hosts")
	if err != nil {
		return ""
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		line, _, _ := strings.Cut(s.Text(), "#")
		fields := strings.Fields(line)
		for _, h := range fields[min(1, len(fields)):] {
			if strings.EqualFold(h, name) {
				return strings.Join(fields, " ")
			}
		}
	}
	return ""
}
