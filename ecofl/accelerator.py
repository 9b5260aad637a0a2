"""Where tensors live: a device setting (``auto`` | ``cpu`` | ``cuda`` | ``cuda:N``) and what it resolves to.

Flower's convention (its PyTorch examples): a ClientApp trains on the GPU
its Ray actor was given. ``auto`` is exactly that, the accelerator this
process sees, else the CPU. ``cuda`` without one is a :class:`UserError`
naming the setting, raised before anything starts. ``cuda:N`` counts the
GPUs this process sees (under Ray, an actor sees only the ones Ray gave it).

:func:`check_device_spec` checks the spelling without importing torch, so
configuration readers stay light; :func:`resolve_device` asks torch.

On a GPU, training runs in full float32: TF32 (cuDNN's default for
convolutions on Ampere and later) is turned off, so a home trained with its
dispatch's other homes (a vmapped, grouped convolution) and the same home
trained alone agree to rounding, as on the CPU (``tests/test_batched_training.py``).

A home's devices may have GPUs too (a pool entry's ``accelerator``,
docs/pipeline_accelerators.md): :func:`check_accelerators` refuses a device
whose GPU this machine lacks, a worker keeps its tensors on
:func:`module_device`, times GPU work after :func:`finish`, and every tensor
leaves its device through :func:`host_copy` / :func:`host_array` (no
``.numpy()`` elsewhere: ``tests/test_house.py``).
"""

from __future__ import annotations

import re

from ecofl.errors import UserError

#: The settings a device may be given; ``cuda:N`` stands for any GPU index.
DEVICE_CHOICES = ("auto", "cpu", "cuda", "cuda:N")
_SPEC = re.compile(r"auto|cpu|cuda(:\d+)?")


def check_device_spec(spec: object, setting: str = "device") -> str:
    """``spec`` when it is one of :data:`DEVICE_CHOICES`, else a UserError naming ``setting`` and the choices."""
    if not isinstance(spec, str) or not _SPEC.fullmatch(spec):
        raise UserError(f"{setting} must be one of {', '.join(DEVICE_CHOICES)}, got {spec!r}")
    return spec


def resolve_device(spec: str, setting: str = "device"):
    """The ``torch.device`` that ``spec`` names in this process (see the module docstring)."""
    import torch

    spec = check_device_spec(spec, setting)
    if spec == "cpu" or (spec == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if spec == "auto":
        _full_float32()
        return torch.device("cuda", torch.cuda.current_device())
    if not torch.cuda.is_available():
        raise UserError(f"{setting}={spec}: no CUDA device is available to this process "
                        "(torch.cuda.is_available() is False); use cpu or auto")
    device = torch.device(spec)
    index = torch.cuda.current_device() if device.index is None else device.index
    if index >= torch.cuda.device_count():
        raise UserError(f"{setting}={spec}: this process sees {torch.cuda.device_count()} CUDA device(s) "
                        f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})")
    _full_float32()
    return torch.device("cuda", index)


def _full_float32() -> None:
    """No TF32 on this process's GPUs: batched and one-at-a-time training agree (module docstring)."""
    import torch

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False


def device_label(device) -> str:
    """``"cpu"``, or a GPU's index and name (``"cuda:0 NVIDIA H200"``), for summaries and logs."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return device.type
    index = torch.cuda.current_device() if device.index is None else device.index
    return f"cuda:{index} {torch.cuda.get_device_name(index)}"


# -- a home's devices with accelerators (the pipeline runtime) ----------------------------------------------


def check_accelerators(devices, where: str = "pool") -> None:
    """A UserError naming the first device of ``devices`` (``DeviceSpec`` s) whose ``accelerator`` this machine
    lacks, before any worker starts (the workers of ``ecofl home train`` and of a simulated pipeline home are
    processes of this machine). Asks torch only how many GPUs there are (no tensor, no context)."""
    import torch

    for spec in devices:
        if spec.accelerator == "cpu":
            continue
        if not torch.cuda.is_available():
            raise UserError(f"{where}: device {spec.name} has accelerator {spec.accelerator}, but this machine has "
                            "no CUDA device (torch.cuda.is_available() is False); give it accelerator: cpu")
        index = torch.device(spec.accelerator).index or 0
        if index >= torch.cuda.device_count():
            raise UserError(f"{where}: device {spec.name} has accelerator {spec.accelerator}, but this machine has "
                            f"{torch.cuda.device_count()} CUDA device(s)")


def module_device(module):
    """Where ``module``'s tensors live: its first parameter's or buffer's device (the CPU for a module without)."""
    import torch

    for tensor in module.parameters():
        return tensor.device
    for tensor in module.buffers():
        return tensor.device
    return torch.device("cpu")


def finish(device) -> None:
    """Wait for ``device``'s queued work (a GPU runs kernels asynchronously): time GPU work only after this."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_memory(device) -> None:
    """Start a new peak of ``device``'s allocated memory (a GPU's; nothing for the CPU: its peak is the RSS)."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device) -> int | None:
    """The most memory torch allocated on ``device`` since :func:`reset_peak_memory` (None for the CPU)."""
    import torch

    if torch.device(device).type != "cuda":
        return None
    return int(torch.cuda.max_memory_allocated(device))


def host_copy(tensor):
    """``tensor`` on the host, for a socket, numpy or a file: the one place a tensor leaves its device.

    A CPU tensor is returned as it is (no copy); an accelerator's is copied
    into pinned host memory (a page-locked buffer the copy engine writes
    directly; torch's caching host allocator hands the same blocks out again)
    and returned once the copy is done: the caller's stream waits for it, so
    this copy does not overlap the device's next kernels.
    """
    import torch

    if tensor.device.type == "cpu":
        return tensor
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    torch.cuda.current_stream(tensor.device).synchronize()
    return host


def host_array(tensor):
    """``tensor``'s values as a numpy array on the host (:func:`host_copy`, then numpy's view of it)."""
    return host_copy(tensor.detach()).numpy()
