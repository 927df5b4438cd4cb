"""Media tools on local files only: magic-number sniffing (`sniff`), the sandboxed ffprobe runner with the
upload policy gate (`probe`), and argv builders for renders (`render`)."""
