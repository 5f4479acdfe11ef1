"""buzz.ws: frames, the NIP-01 protocol over a real relay, outbound backpressure."""
