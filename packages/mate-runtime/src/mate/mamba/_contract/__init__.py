"""The call contract of every op: validation, the canonical (normalised) calls and the dtype tables. Below the
public API, the dispatcher and both backends; imports nothing of them."""
