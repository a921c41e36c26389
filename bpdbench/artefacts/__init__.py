"""Every artefact a method reads, in one home: the one rule for building them on first use and the builders the
command runtime registers for it (`policy`: decoding asks by kind and never imports a trainer), the graph of what a
cell needs built before it starts (`graph`), the checks before the model loads (`checks`), the heads cache
(`heads`), rescorers (`rescorers`), the lookup tables and suffix indexes (`tables`, `suffix`) and the formats their
sources come in (`corpus`, `history`)."""
from .policy import MINUTES, Need, builder, register, warn_use

__all__ = ["MINUTES", "Need", "builder", "register", "warn_use"]
