"""The optimizers' names, in a module of their own: a config (a scaling recipe, say) checks a name
without importing JAX, which every process loading the code location would otherwise pay for."""

NAMES = ("adamw", "adamh", "muon")
