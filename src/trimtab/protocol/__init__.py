"""The wire: message kinds, the header codec, and typed headers."""
