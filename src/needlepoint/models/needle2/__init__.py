"""Needle 2 (archive tag 0x05E12A83): a numpy engine behind `needlepoint.load()`.

Modules, one idea each: `config` (header geometry, depth ladder), `weights` (decode once
at load), `engram`, `mhc`, `attention`, `mlp` (the block pieces), `forward` (one chunk of
positions through the whole model), `state` + `session` (per-sequence decode state),
`heads` (probe heads), `trace` (parity-ladder recorder) and `model` (`V2Model`).
"""
