"""The state formats: each dtype a state can be stored in (an SSU or ReplaySSM pool, an intermediate buffer, the
SSD prefill's initial and final states), one :class:`StateFormat` row, keyed by the dtype's name (TileLang's and
torch's spelling). The kernels, the runtime's torch dtype tables (``mate.mamba._contract.dtypes``), the planners'
tuning keys, the reference backend's quantisation, the benchmarks' labels and the tests read these rows; a fact
about a format is written here only. The float formats double as the io dtypes (:data:`BYTES`).

A block-scaled format (``qmax`` set) stores a state row of ``N`` values as numbers times one fp32 scale per (slot,
head, dim) row: a row written gets the scale max|row| / qmax (1 for an all-zero row) and its numbers rounded to
nearest even and clamped to +-qmax (FlashInfer 0.7.2's int16 rule; int8 and fp8-e4m3 with their own qmax).
int8 and fp8-e4m3 also round stochastically (a ReplaySSM checkpoint with ``rand_seed``): the scaled value's
magnitude goes to the format's grid below or above it with the probability of its remainder (16 random bits),
saturated at qmax and signed as the value; the grid is the integers, or a float format's: steps of 2^(e -
``mantissa``) in the binade [2^e, 2^(e+1)), at least 2^``min_exp`` (``mate.mamba._reference.rounding``).

A new format is its row here (``getattr(torch, name)`` must exist): the runtime's dtype tables and argument
checks, the planners' dtype names and tuning keys, the reference's quantisation, the benchmarks' labels (and
their block-scaled cases), the quantised tests' cases follow from it. Besides the row it needs:

* its kernel branch where the kernels have none: a block-scaled format's widening to fp32 and narrowing back
  (:func:`.ssu_parts.row_ops`' ``quant_ops``: integers of 1 and 2 bytes, floats by the conversion); stochastic
  rounding (``"stochastic"`` in ``rounding``) its own kernel and reference code (float16's: ``philox_rounds``,
  ``mate.mamba._reference.rounding``; a block-scaled format's: :func:`.ssu_parts.row_ops`' ``quant_ops``, from
  its grid);
* rows ``(tuning_key, "one_token")`` and ``(tuning_key, "packed")`` in ``mate.mamba._tilelang.ssu_plan.TUNING``
  for a new ``tuning_key`` (and ``(sr_tuning_key, ...)`` with stochastic rounding); ``replay_plan.tuning`` tunes
  by fp32 / 2-byte / block-scaled;
* its specs in the compile grids (``mate.mamba._tilelang.{ssu,replay,ssd}.compile_grid``), their recorded sources
  (``nox -s compile``) and its row in the registry's pinning test
  (``packages/mate-kernels/tests/test_kernel_factories.py``).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class StateFormat:
    name: str  # the dtype's name (torch's and TileLang's)
    label: str  # its short name in benchmark reports and options
    bytes: int  # per stored value
    tuning_key: str  # the SSU planner's TUNING rows of this format: (tuning_key, kernel)
    qmax: float | None = None  # block-scaled: the largest stored magnitude (see the module docstring)
    integer: bool = False  # integer numbers (torch's cast truncates: a value is rounded to nearest even first)
    rounding: tuple[str, ...] = ("nearest-even",)  # how written values round; "stochastic" with a rand_seed
    mantissa: int = 0  # a block-scaled float format's mantissa bits and smallest step 2^min_exp: the grid its
    min_exp: int = 0  # stochastic rounding rounds to (module docstring)

    @property
    def block_scaled(self) -> bool:
        return self.qmax is not None

    @property
    def sr_tuning_key(self) -> str | None:
        """The SSU planner's TUNING key of the stochastically rounded format (None where the SSU kernels do not
        round it stochastically: no stochastic rounding, or block-scaled, whose seed is a ReplaySSM checkpoint's)."""
        return f"{self.label}-sr" if "stochastic" in self.rounding and not self.block_scaled else None


FORMATS = {
    f.name: f
    for f in (
        StateFormat("float32", "fp32", 4, "fp32"),
        StateFormat("bfloat16", "bf16", 2, "2-byte"),
        StateFormat("float16", "fp16", 2, "2-byte", rounding=("nearest-even", "stochastic")),
        StateFormat("int16", "int16", 2, "int16", qmax=32767.0, integer=True),
        StateFormat("int8", "int8", 1, "int8", qmax=127.0, integer=True, rounding=("nearest-even", "stochastic")),
        StateFormat(
            "float8_e4m3fn",
            "fp8",
            1,
            "fp8",
            qmax=448.0,
            rounding=("nearest-even", "stochastic"),
            mantissa=3,
            min_exp=-9,
        ),
    )
}
BYTES = {name: f.bytes for name, f in FORMATS.items()}  # bytes per value of a state (or io) dtype
QMAX = {name: f.qmax for name, f in FORMATS.items() if f.block_scaled}  # the block-scaled formats' qmax

__all__ = ["BYTES", "FORMATS", "QMAX", "StateFormat"]
