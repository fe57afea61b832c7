"""Running things: pinned environments and containers, launching planned runs under a timeout, the manifest of
what ran, a GPU node's preflight (docs/design.md)."""
