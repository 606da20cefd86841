"""A procedural text-to-video world small enough to train a tiny STDiT3 on a CPU, with detectors to score it.

Modules: `world` (scenes, objects, colours, motions; the clip renderer), `prompts` (captions, train / held-out
split), `detect` (scene, shape, colour and motion read back from pixels), `latent` (the fixed pixel-space
4-channel 'latent'), `text` (hashed word features in T5's place), `model` (video spec, schedule, tiny STDiT3
config), `data` (seeded batches), `train` (resumable rectified-flow training), `evaluate` (sample and score),
`quality` (PSNR / SSIM, donors, leakage), `experiment` and `quality_report` (the quality benchmark's runs and
summaries), `stream` (the demo's request stream), `text_table` (plain-text tables).
Plain torch and numpy; nothing here imports ComfyUI.
"""
