"""OpenSora 1.2 STDiT3 as a native ComfyUI model type (glue: imports ComfyUI, so only nodes and tier-2 tests import it).

Design (details in `opensora.comfy_adapter`):
- `OpenSoraModel` is a `comfy.model_base.BaseModel` of type FLOW: CONST sampling with ModelSamplingDiscreteFlow,
  multiplier 1000 (model timestep = 1000 * sigma, OpenSora's unit) and the OpenSora shift of the default video
  (240p 9:16, 51 frames: 2.421875). The shift depends on the video size; `with_video` (the "OpenSora Model
  Sampling" node) patches it per latent, and `CHAI_OpenSoraScheduler` gives the exact sigmas for SamplerCustom.
  KSampler's "simple" scheduler reads that shift's 1000-entry table at evenly spaced indices: with the right
  shift it equals the exact schedule when 1000/steps is whole (8, 10, 20, 25, 40, 50 steps) and differs by at
  most 1.5e-3 in sigma at 240p / 30 steps (4.6e-3 at 720p / 204 frames); "normal", "beta" and "sgm_uniform"
  differ by 4e-3 to 0.5 and should not be used for parity.
- `ComfySTDiT3` is STDiT3 with ComfyUI's call signature (x, timestep, context, transformer_options, ...), built
  with `comfy.ops` layers (weight casting, low-VRAM offload, LoRA weight patches) and wrapped by the
  DIFFUSION_MODEL wrapper like ComfyUI's own DiTs. It returns -v (ComfyUI's flow sign).
- `OpenSoraLatentFormat`: 4 channels, 3-D. LATENT tensors hold OpenSora's *normalised* latent (model space),
  because OpenSora's VAE pipeline applies its per-channel shift/scale itself (encode: (z - shift) / scale,
  decode: z * scale + shift); so process_in/out are the identity and the statistics are kept only as data.
- Text: the positive CONDITIONING is ComfyUI's T5-XXL output [1, L, 4096] (CLIPLoader type "pixart", no
  padding); a padded T5 variant's "attention_mask" is honoured by dropping the padded tokens in `extra_conds`.
- Nominal pixel size and fps (position-embedding scale, fps embedding) come from transformer_options["opensora"]
  (set by `with_video`) when it fits the latent, else from the latent shape (exact for every Open-Sora preset).
- Patches: ComfyUI merges model_options["transformer_options"] into every model call and BaseModel passes it to
  the diffusion model's forward, and `comfy_forward` hands them on to `STDiT3.forward(transformer_options=...)`:
  `model.set_model_patch_replace(fn, "dit", "spatial_block", 0)` replaces spatial block 0 (ComfyUI's DiT block
  patch), an "optimized_attention_override" reaches every self-attention (CHAI's Cache Attention uses both),
  `set_model_patch_replace(fn, "dit", "spatial_attn", 0)` replaces block 0's spatial self-attention (STDiT3
  `attn_replace`), and object patches such as "diffusion_model.spatial_blocks.0.attn.forward" work as on any
  module.
- Fixed-size checkpoints (the toy-world model): when the file's metadata declares a `FixedSampling`
  (`comfy_adapter.fixed_sampling_from_metadata`), the model's flow shift is that shift rather than OpenSora's
  (so KSampler's "simple" schedule is the trained one: exact when 1000/steps is whole, within 1e-3 otherwise),
  and the network carries it as `fixed_sampling` for its nominal size and frame count.
- Memory: memory_usage_factor from the block activations per token (`comfy_adapter.memory_usage_factor`, 0.49
  for XL/2).
"""
from __future__ import annotations

import logging
import math
import os
from typing import Any

import torch
from torch import Tensor

import comfy.conds
import comfy.latent_formats
import comfy.model_base
import comfy.model_management
import comfy.model_patcher
import comfy.model_sampling
import comfy.patcher_extension
import comfy.supported_models_base

from .comfy_adapter import (DEFAULT_SHIFT, MULTIPLIER, VIDEO_KEY, FixedSampling, comfy_forward,
                            fixed_sampling_from_metadata, memory_usage_factor, trim_padding, video_to_dict)
from .loading import load_stdit3, parse_dtype
from .presets import VideoSpec
from .schedule import opensora_shift
from .stdit3 import STDiT3, STDiT3Config

log = logging.getLogger(__name__)

# Per-channel statistics of OpenSoraVAE_V1_2 (normalised latent = (z - shift) / scale); applied by the VAE.
VAE_LATENT_SHIFT = (-0.10, 0.34, 0.27, 0.98)
VAE_LATENT_SCALE = (3.85, 2.32, 2.33, 3.06)
DTYPE_CHOICES = ("default", "fp32", "fp16", "bf16")
# bf16 first: OpenSora 1.2 was trained and is run in bf16; ComfyUI's "default" picks the first usable one.
SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class OpenSoraLatentFormat(comfy.latent_formats.LatentFormat):
    """OpenSora 1.2 video latent: 4 channels, [B, 4, T, H/8, W/8], already normalised by the VAE pipeline."""

    latent_channels = 4
    latent_dimensions = 3
    scale_factor = 1.0
    latent_rgb_factors = None  # no fitted preview factors yet: ComfyUI shows no latent preview
    taesd_decoder_name = None

    def __init__(self) -> None:
        self.vae_shift = torch.tensor(VAE_LATENT_SHIFT).view(1, 4, 1, 1, 1)
        self.vae_scale = torch.tensor(VAE_LATENT_SCALE).view(1, 4, 1, 1, 1)

    def process_in(self, latent: Tensor) -> Tensor:
        """Identity: LATENTs are already in model space (OpenSora's VAE normalises)."""
        return latent

    def process_out(self, latent: Tensor) -> Tensor:
        """Identity (see process_in)."""
        return latent


class ComfySTDiT3(STDiT3):
    """STDiT3 with ComfyUI's diffusion-model call convention; state-dict names are STDiT3's (official) names."""

    # ComfyUI calls its diffusion model as (x, timestep, context, ...); STDiT3.forward is reached via comfy_forward.
    def forward(self, x: Tensor, timestep: Tensor, context: Tensor | None = None,  # type: ignore[override]
                transformer_options: dict | None = None, **kwargs: Any) -> Tensor:
        """ComfyUI entry: -v for latent x at timestep 1000*sigma; DIFFUSION_MODEL wrappers run around it."""
        options = transformer_options if transformer_options is not None else {}
        wrappers = comfy.patcher_extension.get_all_wrappers(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL,
                                                            options)
        # Positional transformer_options last, as ComfyUI's DiTs pass it (wrappers such as EasyCache read args[-1]).
        return comfy.patcher_extension.WrapperExecutor.new_class_executor(
            self._comfy_forward, self, wrappers).execute(x, timestep, context, options, **kwargs)

    def _comfy_forward(self, x: Tensor, timestep: Tensor, context: Tensor | None,
                       transformer_options: dict | None = None, **kwargs: Any) -> Tensor:
        # `control` and other extra conds are accepted and ignored: STDiT3 has no ControlNet inputs.
        return comfy_forward(self, x, timestep, context, transformer_options)


class OpenSoraModelConfig(comfy.supported_models_base.BASE):
    """ComfyUI model config for STDiT3 (not registered for auto-detection: load with the CHAI loader node)."""

    unet_config: dict[str, Any] = {}
    unet_extra_config: dict[str, Any] = {}  # BASE's default adds UNet head settings STDiT3 does not take
    sampling_settings = {"shift": DEFAULT_SHIFT, "multiplier": MULTIPLIER}
    latent_format = OpenSoraLatentFormat
    supported_inference_dtypes = list(SUPPORTED_DTYPES)
    memory_usage_factor = memory_usage_factor(STDiT3Config())

    def __init__(self, config: STDiT3Config, shift: float | None = None) -> None:
        super().__init__(config.to_dict())
        self.stdit3_config = config
        self.memory_usage_factor = memory_usage_factor(config)
        if shift is not None:  # a checkpoint with its own fixed shift (BASE copied sampling_settings per instance)
            self.sampling_settings["shift"] = float(shift)

    def model_type(self, state_dict: Any = None, prefix: str = "") -> comfy.model_base.ModelType:
        """Rectified flow."""
        return comfy.model_base.ModelType.FLOW

    def get_model(self, state_dict: Any = None, prefix: str = "", device: Any = None) -> "OpenSoraModel":
        """The BaseModel wrapping a freshly built ComfySTDiT3 (weights uninitialised unless loaded)."""
        return OpenSoraModel(self, device=device)


class OpenSoraModel(comfy.model_base.BaseModel):
    """ComfyUI BaseModel for STDiT3: FLOW sampling, identity latent format, T5 cross-attention conditioning."""

    def __init__(self, model_config: OpenSoraModelConfig, model_type: Any = None, device: Any = None) -> None:
        super().__init__(model_config, model_type or comfy.model_base.ModelType.FLOW, device=device,
                         unet_model=ComfySTDiT3)
        # Weights may be stored in one dtype and computed in another (ComfyUI's manual cast, e.g. bf16 on CPU).
        self.diffusion_model.dtype = self.manual_cast_dtype

    def get_dtype(self) -> torch.dtype:
        """Storage dtype of the weights (the compute dtype is manual_cast_dtype when set)."""
        return self.diffusion_model.x_embedder.proj.weight.dtype

    def extra_conds(self, **kwargs: Any) -> dict[str, Any]:
        """Cross-attention from the CONDITIONING tensor, padded T5 tokens dropped when a mask came with it."""
        out = super().extra_conds(**kwargs)
        cross_attn = kwargs.get("cross_attn")
        if cross_attn is not None:
            out["c_crossattn"] = comfy.conds.CONDCrossAttn(trim_padding(cross_attn, kwargs.get("attention_mask")))
        return out

    @property
    def stdit3_config(self) -> STDiT3Config:
        """Architecture of the wrapped STDiT3."""
        return self.diffusion_model.config


def resolve_dtype(choice: str, parameters: int, load_device: torch.device) -> torch.dtype:
    """Weight dtype for a loader choice: "default" asks ComfyUI (bf16/fp16 on GPUs that run them, else fp32)."""
    if choice == "default":
        return comfy.model_management.unet_dtype(device=load_device, model_params=parameters,
                                                 supported_dtypes=list(SUPPORTED_DTYPES))
    return parse_dtype(choice)


def build_patcher(model: STDiT3, fixed: FixedSampling | None = None) -> comfy.model_patcher.ModelPatcher:
    """Move a loaded STDiT3's tensors into a comfy.ops-built OpenSoraModel (`fixed`: its shift, video); wrap it."""
    load_device = comfy.model_management.get_torch_device()
    offload_device = comfy.model_management.unet_offload_device()
    weight_dtype = model.x_embedder.proj.weight.dtype
    config = OpenSoraModelConfig(model.config, shift=None if fixed is None else fixed.shift)
    manual_cast = comfy.model_management.unet_manual_cast(weight_dtype, load_device, config.supported_inference_dtypes)
    config.set_inference_dtype(weight_dtype, manual_cast)
    base = config.get_model(device="meta")
    # assign=True hands the loaded tensors over (no copy), so loading peaks at one model in memory.
    base.diffusion_model.load_state_dict(model.state_dict(), strict=True, assign=True)
    base.diffusion_model.eval().requires_grad_(False)
    base.diffusion_model.fixed_sampling = fixed
    base = base.to(offload_device)
    return comfy.model_patcher.ModelPatcher(base, load_device=load_device, offload_device=offload_device)


def load_opensora_model(path: str | os.PathLike, dtype: str = "default") -> comfy.model_patcher.ModelPatcher:
    """Load an STDiT3 checkpoint as a ComfyUI MODEL; raises our loader's CheckpointError for a wrong file."""
    from .loading import find_prefix, read_checkpoint_header

    load_device = comfy.model_management.get_torch_device()
    shapes: dict[str, tuple[int, ...]] = {}
    metadata: dict[str, str] = {}
    if str(path).lower().endswith(".safetensors"):
        shapes, metadata = read_checkpoint_header(path)
    fixed = fixed_sampling_from_metadata(metadata)
    if dtype == "default":
        prefix = find_prefix(shapes)
        parameters = sum(math.prod(s) for k, s in shapes.items() if prefix is None or k.startswith(prefix))
        weight_dtype = resolve_dtype("default", parameters, load_device)
    else:
        weight_dtype = resolve_dtype(dtype, 0, load_device)
    model = load_stdit3(path, dtype=weight_dtype, device="cpu")
    patcher = build_patcher(model, fixed)
    log.info("[CHAI] OpenSora STDiT3 loaded from %s: hidden %d, depth %d, weights %s, compute %s%s", path,
             model.config.hidden_size, model.config.depth, weight_dtype,
             patcher.model.manual_cast_dtype or weight_dtype,
             "" if fixed is None else f", fixed size {fixed.height}x{fixed.width}x{fixed.num_frames} "
                                      f"with flow shift {fixed.shift:g}")
    return patcher


def is_opensora(model: Any) -> bool:
    """True for a ModelPatcher (or BaseModel) holding an OpenSora STDiT3."""
    base = getattr(model, "model", model)
    return isinstance(base, OpenSoraModel)


def fixed_sampling(model: Any) -> FixedSampling | None:
    """The fixed shift and video a fixed-size checkpoint (the toy-world model) declared; None for OpenSora's."""
    if not is_opensora(model):
        return None
    if hasattr(model, "get_model_object"):  # a ModelPatcher: honour object patches of the network
        return getattr(model.get_model_object("diffusion_model"), "fixed_sampling", None)
    return getattr(model.diffusion_model, "fixed_sampling", None)


def flow_sampling(model_config: Any, shift: float) -> Any:
    """A ComfyUI flow model_sampling object (CONST + DiscreteFlow, multiplier 1000) with the given shift."""

    class OpenSoraModelSampling(comfy.model_sampling.ModelSamplingDiscreteFlow, comfy.model_sampling.CONST):
        pass

    sampling = OpenSoraModelSampling(model_config)
    sampling.set_parameters(shift=shift, multiplier=MULTIPLIER)
    return sampling


def with_video(model: comfy.model_patcher.ModelPatcher, video: VideoSpec, *, set_shift: bool = True,
               bf16_shift: bool = True) -> comfy.model_patcher.ModelPatcher:
    """Clone of an OpenSora MODEL whose forward uses this nominal video and (set_shift) whose shift fits it."""
    fixed = fixed_sampling(model)
    if fixed is not None:
        raise ValueError(f"this checkpoint was trained at one size ({fixed.height}x{fixed.width}, "
                         f"{fixed.num_frames} frames) with its own flow shift {fixed.shift:g}, which the loader "
                         "already set; connect the loader's MODEL to the sampler directly")
    m = model.clone()
    options = m.model_options.setdefault("transformer_options", {})
    options[VIDEO_KEY] = video_to_dict(video)
    if set_shift:
        shift = opensora_shift(video.height, video.width, video.num_frames, bf16=bf16_shift)
        m.add_object_patch("model_sampling", flow_sampling(m.model.model_config, shift))
    return m


def null_caption(model: comfy.model_patcher.ModelPatcher, length: int) -> Tensor:
    """The model's null caption (the first `length` rows of y_embedding) as a float32 CPU tensor [1, length, C]."""
    table = model.get_model_object("diffusion_model").y_embedder.y_embedding
    if not 0 < length <= table.shape[0]:
        raise ValueError(f"caption length {length} is outside 1..{table.shape[0]} (the model's null-caption rows)")
    return table[:length].detach().to(device="cpu", dtype=torch.float32).clone()[None]


__all__ = [
    "OpenSoraLatentFormat", "ComfySTDiT3", "OpenSoraModelConfig", "OpenSoraModel", "DTYPE_CHOICES",
    "SUPPORTED_DTYPES", "VAE_LATENT_SHIFT", "VAE_LATENT_SCALE", "resolve_dtype", "build_patcher",
    "load_opensora_model", "is_opensora", "fixed_sampling", "flow_sampling", "with_video", "null_caption",
]
