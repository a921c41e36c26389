"""Draft networks: the blockwise heads, the Medusa, Hydra, EAGLE, Amphista and KOALA networks, and
the small LM, with their save formats. Decoding reads them through `methods/`; training writes them (`train/`)."""
