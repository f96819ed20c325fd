"""Named random streams, and the fork of the global RNG that makes a random forward repeatable.

Every random draw of a check comes from its own stream, seeded from the case's seed and
independent of the stream the inputs are drawn from, so adding a draw to one check never moves
another check's numbers. ``Streams`` is one attempt's seed, made once by the runner and handed
down: whoever draws asks it for a generator by the stream's name. Pure torch.
"""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


class Stream(enum.IntEnum):
    """The random streams of the numerics and of the backward check's parts (the numbers are part of the
    reproducibility: a seed replays a run). Every other check declares its own number, ``STREAM`` in its
    module (a test keeps them all apart)."""

    PROJECTION = 0  # the random projection of the outputs that names patterns (e.g. a transpose)
    BACKWARD = 1  # backward's contract and determinism grad_outputs
    PROBES = 3  # --fast probes v^T J u
    STRICT = 4  # --strict: the direction along which the finite differences' own error is estimated
    COMPRESSION = 5  # compressed finite differences: the weights of the groups' second moves
    ROW_GROUPS = 6  # compressed analytical rows: the weights that name each column's row
    LINEARITY = 7  # backward's linearity in grad_output: the one-hot's places
    MODULE_INIT = 100  # an nn.Module's parameters


@dataclass(frozen=True)
class Streams:
    """The random streams of one attempt at a case, all from one seed (0 <= seed < 2**64): the inputs'
    stream, one CPU generator per ``Stream``, and the state every forward starts from (``RngFork``)."""

    seed: int = 0

    def generator(self, stream: int) -> torch.Generator:
        """A new CPU generator for ``stream`` (each call starts it afresh), independent of the inputs' stream."""
        return torch.Generator().manual_seed((self.seed * 1_000_003 + 7919 * (int(stream) + 1)) % 2**63)

    def inputs(self) -> torch.Generator:
        """A new CPU generator for the inputs' draws: seeded with the seed itself."""
        return torch.Generator().manual_seed(self.seed)


def signed_uniform(shape: Sequence[int], gen: torch.Generator, scaled: bool = True) -> torch.Tensor:
    """Float64 random probe values, uniform on (-1, 1) in 2^16 steps symmetric about 0. Made from
    the generator's raw bits, which torch draws faster than normals: a probe needs
    independent, symmetric values that are almost never equal, not a Gaussian (torch's fast mode
    draws uniform ones too). Not ``scaled``: the same values times 2^15 (on (-2^15, 2^15)), for
    vectors made unit afterwards: the same unit vectors, bit for bit (a power of 2 scales exactly)."""
    n = math.prod(shape)
    bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), None, generator=gen)
    values = bits.view(torch.int16)[:n].to(torch.float64).add_(0.5)
    return (values.div_(2**15) if scaled else values).view(tuple(shape))


@dataclass
class RngFork:
    """The global RNG (the CPU generator and those of CUDA devices in use) forked for the checks.

    Every forward starts from the same state, seeded from the case's seed, so a Function that
    draws random numbers (dropout) is one deterministic function for the checks, the same in any
    process; after each forward the user's state is put back. Setting a state costs about half a
    microsecond, so it is done unconditionally.
    """

    cpu: torch.Tensor  # where every forward starts
    cuda: list[tuple[int, torch.Tensor]]
    user_cpu: torch.Tensor  # what the user had
    user_cuda: list[tuple[int, torch.Tensor]]

    @classmethod
    def capture(cls, values: list[Any], streams: Streams) -> RngFork:
        """The fork for a call on ``values``: every forward starts from ``manual_seed(streams.seed)``;
        the user's state now is what is put back."""
        seed = streams.seed
        devices = sorted({v.get_device() for v in values if isinstance(v, torch.Tensor) and v.is_cuda})
        return cls(
            _seeded_state(seed),
            [(d, torch.Generator(f"cuda:{d}").manual_seed(seed).get_state()) for d in devices],
            torch.default_generator.get_state(),
            [(d, torch.cuda.default_generators[d].get_state()) for d in devices],
        )

    def restore(self) -> None:
        """Set the state every forward starts from."""
        self._set(self.cpu, self.cuda)

    def release(self) -> None:
        """Put the user's state back."""
        self._set(self.user_cpu, self.user_cuda)

    @staticmethod
    def _set(cpu: torch.Tensor, cuda: list[tuple[int, torch.Tensor]]) -> None:
        torch.default_generator.set_state(cpu)
        for d, state in cuda:
            torch.cuda.default_generators[d].set_state(state)


@functools.lru_cache(maxsize=64)
def _seeded_state(seed: int) -> torch.Tensor:
    """The CPU generator's state right after ``manual_seed(seed)`` (the same for every check with that seed;
    only read: ``set_state`` copies it)."""
    return torch.Generator().manual_seed(seed).get_state()
