// Command imagetools stands in, inside the stand-in test images (../images.sh),
// for the programs upstream's e2e images take from Alpine or Debian that
// Debian's busybox-static lacks or builds without the flags the specs pass:
// curl, nc (-v -t -u -z), dig and getent, and nonewprivs' nnp; and sh, which
// runs busybox ash or bash (sh.go). It is a
// multi-call binary chosen by the name it runs as, and implements only the
// subset of each tool's command line that the e2e suite of the pinned release
// uses; anything else is a usage error (exit 2), so that a spec using more
// fails visibly rather than wrongly.
package main

import (
	"fmt"
	"os"
	"path/filepath"
)

var tools = map[string]func(args []string) int{
	"curl":   curl,
	"nc":     nc,
	"dig":    dig,
	"getent": getent,
	// nonewprivs' setuid-root probe: the image installs a setuid copy.
	"nnp": func([]string) int { fmt.Printf("Effective uid: %d\n", os.Geteuid()); return 0 },
}

func main() {
	name := filepath.Base(os.Args[0])
	if name == "sh" {
		os.Exit(shell(os.Args))
	}
	args := os.Args[1:]
	if _, ok := tools[name]; !ok && len(args) > 0 {
		name, args = args[0], args[1:]
	}
	run, ok := tools[name]
	if !ok {
		fmt.Fprintln(os.Stderr, "usage: imagetools {curl|nc|dig|getent|nnp} ARGS... (or run through a link of that name)")
		os.Exit(2)
	}
	os.Exit(run(args))
}

// usage reports a command line the stand-in does not implement.
func usage(tool, format string, a ...any) int {
	fmt.Fprintf(os.Stderr, "%s (e2e stand-in): %s\n", tool, fmt.Sprintf(format, a...))
	return 2
}
