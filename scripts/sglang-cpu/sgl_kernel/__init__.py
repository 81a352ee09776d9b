"""Stand-in for SGLang's kernel package (PyPI `sglang-kernel`) on a CPU without CUDA.

The kernel wheels on PyPI are CUDA builds: importing them needs the NVIDIA driver
(libcuda.so.1). SGLang's CPU kernels are not published on PyPI. The SGLang server imports
kernel names at module load time even where its CPU path for the model never calls them
(the tiny Qwen3 runs on torch's own ops with `--attention-backend torch_native` on a CPU
without AMX). This package makes every name resolvable and makes every call fail loudly,
so a server started with it can only work if no kernel is ever executed: nothing is
emulated.

scripts/setup-sglang.sh copies this directory into the SGLang virtualenv.
"""

__version__ = "0.0.0+incontext-cpu-stand-in"


class MissingKernel:
    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{self._name} is not available on this CPU-only installation")

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return MissingKernel(f"{self._name}.{attr}")


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return MissingKernel(name)
