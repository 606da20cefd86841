"""Open-Sora 1.2 in plain torch: the STDiT3 video transformer, its checkpoint loader, schedule, captions, sampler.

Importing the package is light (no torch): import the submodule you need, e.g. `from opensora.stdit3 import STDiT3`.
"""
