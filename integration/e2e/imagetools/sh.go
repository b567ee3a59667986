package main

import (
	"fmt"
	"os"
	"regexp"
	"syscall"
)

// identifier is a name a POSIX shell can hold as a variable.
var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// shell stands in for upstream's busybox sh, /bin/sh in the stand-in images.
// Upstream's image keeps environment variables whose names are not shell
// identifiers (a ConfigMap key "data-1") in what `sh -c env` prints, and words
// its errors as busybox ash does ("/bin/sh: can't create /file: Read-only file
// system"); the specs check both. Debian's busybox ash drops such variables
// before it runs a command, and bash keeps them but words its errors its own
// way. So: bash (/bin/bash, bash-static) when the environment holds such a
// name, busybox ash otherwise, each run with this process's arguments, argv[0]
// included (ash prefixes its errors with it).
func shell(argv []string) int {
	path := "/bin/busybox"
	for _, kv := range os.Environ() {
		name := kv
		for i := 0; i < len(kv); i++ {
			if kv[i] == '=' {
				name = kv[:i]
				break
			}
		}
		if !identifier.MatchString(name) {
			path = "/bin/bash"
			break
		}
	}
	// busybox picks its applet by argv[0]'s base name: "sh".
	err := syscall.Exec(path, argv, os.Environ())
	fmt.Fprintf(os.Stderr, "sh (e2e stand-in): exec %s: %v\n", path, err)
	return 127
}
