"""CHAI inside ComfyUI: the only part of the method that touches ComfyUI, and only inside functions.

One request, in the order it runs (docs/cache-attention.md says where state lives and which samplers fire when):

- `schedule.py`: the sigmas of a sampler/scheduler pair, the latent the sampler will see;
- `lookup.py`: `request_key` (adapter, fingerprint, latent shape: the one way the three nodes identify a request)
  and `chai_lookup` (CHAI Cache Lookup);
- `prepare.py`: `prepare` (sampler check, refusals, the key, the plan: fast on a usable hit, else full with a
  donor capture, `capture.py`) and `patch` (the run or the capture on a ModelPatcher clone), shared by
- `sample.py`: `chai_sample` (CHAI Sampler drives `sample_custom` itself, one or two experts) and
- `apply.py`: `chai_apply` (CHAI Apply returns the patched clone for any sampler node);
- back in `request.py`: `finish_fast` / `finish_full` and `trace_for` (the CHAI_TRACE that CHAI Cache Write stores);
- `text.py`: the workflow's CLIP as the entity embedder.

Importing this package needs no ComfyUI. The shared MODEL is never modified: sampling runs on a clone, per-run
state travels in its transformer_options, and everything added is removed in a `finally`.
"""
