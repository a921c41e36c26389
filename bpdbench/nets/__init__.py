"""Draft networks: the Medusa-style heads, the trained drafters (Medusa, Hydra, EAGLE, Amphista, KOALA layers) and
the small LM, with their save formats. Decoding reads them through `methods/`; training writes them (`train/`)."""
