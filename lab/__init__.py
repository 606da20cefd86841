"""The toy world's research code, beside bench/ and never imported by the pack at run time.

Modules: `data` (seeded batches), `train` (resumable rectified-flow training), `evaluate` (sample and score),
`quality` (PSNR / SSIM, donors, leakage), `experiment` and `quality_report` (the toy quality benchmark's runs and
summaries), `lab`, `lab_report` and `lab_plots` (the quality lab's grid, scores and figures), `measures` and
`features` (ground-truth measures and the toy world's learned video features, weights in `measure_weights/`).
Like the benches, these modules import the pack by its installed name (`comfyui_chai.toyworld`, ...) and each
other as `lab.<module>`; run them from the repository root (`python -m pytest`, `python bench/<name>.py`).
"""
