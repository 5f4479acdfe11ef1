"""buzz.nostr: the pure protocol (events, BIP-340, NIP-42, NIP-98, NIP-OA), against vectors and properties."""
