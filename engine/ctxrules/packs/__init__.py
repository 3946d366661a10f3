"""Rule packs: reading YAML with positions, resolving ``extends``, merging, origins."""
