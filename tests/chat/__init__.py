"""buzz.chat: NIP-29 channels, kind-9 messages and their counters, write quotas, operator commands."""
