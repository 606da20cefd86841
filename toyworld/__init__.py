"""A procedural text-to-video world small enough to train a tiny STDiT3 on a CPU: what the toy nodes and the demo run.

Modules: `world` and `detail` (scenes, objects, colours, motions, the detail captions do not fix; the clip
renderer), `prompts` (captions, train / held-out split), `detect` (scene, shape, colour and motion read back from
pixels), `latent` (the fixed pixel-space 4-channel 'latent'), `text` (hashed word features in T5's place), `model`
(video spec, schedule, tiny STDiT3 config, the shipped weights in `weights/`), `comfy_adapter` (the toy nodes'
conversions), `stream`, `media` and `text_table` (the demo's request stream, GIFs and plain-text tables).
The trainer, the quality benchmark and the quality lab live in the repository's `lab/` folder.
Plain torch and numpy; nothing here imports ComfyUI.
"""
