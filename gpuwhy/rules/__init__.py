"""The rules language: what a rule is, how rule files are parsed and found, the names rules
can read, and the rules gpuwhy ships (builtin/). The correlator runs them."""
