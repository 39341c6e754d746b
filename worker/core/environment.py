"""Target environments for the resolution preview: a probe of a real node, or a named profile.

Pure data: probing lives in ``worker/engine/probe.py``; this module only describes what a probe found.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

DEVICES = ("cpu", "cuda", "npu")


class UnknownProfileError(KeyError):
    def __init__(self, name: str):
        self.name = name
        super().__init__(f"unknown environment profile {name!r}; valid: {', '.join(PROFILES)}")

    def __str__(self) -> str:  # KeyError quotes its message; this one reads as a sentence
        return self.args[0]


class InvalidEnvironment(ValueError):
    """An environment (probe) the preview cannot use: the field, the value found and what is valid."""

    def __init__(self, field: str, value: Any, problem: str, valid: Any):
        self.field, self.value, self.valid = field, value, valid
        super().__init__(f"{field}: {problem}")


@dataclass(frozen=True)
class Environment:
    """What decides which attention implementations can load on a node."""

    name: str
    device: str = "cpu"
    compute_capability: tuple[int, int] | None = None
    gpu_name: str | None = None
    torch_version: str = "2.13.0"
    transformers_version: str = "5.24.0"
    flash_attn_version: str | None = None
    flash_attn_3_version: str | None = None  # the flash-attn-3 distribution (module flash_attn_interface), Hopper's FA3
    kernels_installed: bool = False
    cuda_version: str | None = None
    description: str = ""
    driver_version: str | None = None  # the NVIDIA driver, from a probe
    kernels_version: str | None = None  # the `kernels` package (hub kernels), from a probe
    hub_reachable: bool | None = None  # whether the node reached the Hugging Face Hub (None: not probed)
    sdpa_backends: tuple[str, ...] = ()  # SDPA backends a probe saw run on the device; empty: not probed

    @property
    def transformers_major(self) -> int:
        head = self.transformers_version.split(".", 1)[0]
        return int(head) if head.isdigit() else 5

    @property
    def flash_attn_installed(self) -> bool:
        return self.flash_attn_version is not None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["compute_capability"] = list(self.compute_capability) if self.compute_capability else None
        out["sdpa_backends"] = list(self.sdpa_backends)
        return out

    @classmethod
    def from_dict(cls, data: Any) -> Environment:
        """Untrusted data (a probe result or a user's JSON) -> Environment; ValueError names the bad field."""
        if not isinstance(data, dict):
            raise InvalidEnvironment("environment", data, f"must be a profile name or an object, got "
                                     f"{type(data).__name__}", valid=["a profile name", "an object"])
        known = sorted(f.name for f in fields(cls))
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise InvalidEnvironment(f"environment.{unknown[0]}", data[unknown[0]],
                                     f"unknown field; valid: {', '.join(known)}", valid=known)
        values = dict(data)
        values.setdefault("name", "probe")
        for key in ("name", "torch_version", "transformers_version", "description"):
            if key in values and not isinstance(values[key], str):
                raise InvalidEnvironment(f"environment.{key}", values[key], f"{values[key]!r} must be a string",
                                         valid="a string")
        for key in ("flash_attn_version", "flash_attn_3_version", "gpu_name", "cuda_version", "driver_version",
                    "kernels_version"):
            if values.get(key) is not None and not isinstance(values[key], str):
                raise InvalidEnvironment(f"environment.{key}", values[key],
                                         f"{values[key]!r} must be a string or null", valid="a string or null")
        backends = values.get("sdpa_backends")
        if backends is None:
            values.pop("sdpa_backends", None)
        elif not isinstance(backends, (list, tuple)) or not all(isinstance(b, str) for b in backends):
            raise InvalidEnvironment("environment.sdpa_backends", backends,
                                     f"{backends!r} must be a list of backend names, e.g. [\"flash_attention\", \"math\"]",
                                     valid=["flash_attention", "efficient_attention", "cudnn_attention", "math"])
        else:
            values["sdpa_backends"] = tuple(backends)
        device = values.get("device", "cpu")
        if device not in DEVICES:
            raise InvalidEnvironment("environment.device", device, f"{device!r} is not valid; valid: "
                                     f"{', '.join(DEVICES)}", valid=list(DEVICES))
        if values.get("hub_reachable") is not None and not isinstance(values["hub_reachable"], bool):
            raise InvalidEnvironment("environment.hub_reachable", values["hub_reachable"],
                                     f"{values['hub_reachable']!r} must be true, false or null",
                                     valid=[True, False, None])
        if not isinstance(values.get("kernels_installed", False), bool):
            raise InvalidEnvironment("environment.kernels_installed", values["kernels_installed"],
                                     f"{values['kernels_installed']!r} must be true or false", valid=[True, False])
        cc = values.get("compute_capability")
        if cc is not None:
            if (
                not isinstance(cc, (list, tuple))
                or len(cc) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 100 for x in cc)
            ):
                raise InvalidEnvironment("environment.compute_capability", cc, f"{cc!r} must be [major, minor], "
                                         "e.g. [8, 0]", valid="[major, minor], each 0 to 99, e.g. [8, 0]")
            values["compute_capability"] = (cc[0], cc[1])
        return cls(**values)


PROFILES: dict[str, Environment] = {
    env.name: env
    for env in (
        Environment(
            name="cpu",
            device="cpu",
            description="CPU only, no flash-attn (this project's development machines).",
        ),
        Environment(
            name="cuda-sm75",
            device="cuda",
            compute_capability=(7, 5),
            gpu_name="Tesla T4",
            cuda_version="12.4",
            description="T4 (Turing, sm75): no FlashAttention 2; flash-attn not installed.",
        ),
        Environment(
            name="cuda-sm80-fa2",
            device="cuda",
            compute_capability=(8, 0),
            gpu_name="A100",
            cuda_version="12.4",
            flash_attn_version="2.8.3",
            description="A100 (Ampere, sm80) with flash-attn 2.8.",
        ),
        Environment(
            name="cuda-sm90-fa2",
            device="cuda",
            compute_capability=(9, 0),
            gpu_name="H100",
            cuda_version="12.8",
            flash_attn_version="2.8.3",
            description="H100 (Hopper, sm90) with flash-attn 2.8.",
        ),
        Environment(
            name="npu",
            device="npu",
            description="Ascend NPU: transformers 5.x short-circuits the FlashAttention 2 check there.",
        ),
    )
}


def get_profile(name: str) -> Environment:
    try:
        return PROFILES[name]
    except KeyError:
        raise UnknownProfileError(name) from None


def environment_from(value: Any) -> Environment:
    """A profile name or a probe/user dict -> Environment (UnknownProfileError / ValueError otherwise)."""
    if isinstance(value, str):
        return get_profile(value)
    return Environment.from_dict(value)
