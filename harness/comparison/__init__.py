"""The paired comparison: two arms (commits, framework versions or configs) trained interleaved until the paired
statistics decide whether B is slower than A, and the bisect that runs it on each commit (docs/regression.md)."""
