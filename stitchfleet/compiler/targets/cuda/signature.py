"""The head of a rendered CUDA kernel: its name checks, parameter list, launch bounds, index variables.

Input: a verified kernel IR `Kernel`. Output: the pieces render.py puts before the body:
`check_names` (RenderError on a name the CUDA C or the prelude reserves), `param`,
`launch_bounds`, `specials` (the thread/block index variables the body reads), `has_grid_sync`
(whether the launcher appends the grid barrier counter, `GRID_COUNTER`), and `CudaKernel`,
what rendering hands the launchers.
"""

from __future__ import annotations

from dataclasses import dataclass

from stitchfleet.compiler.kernel import ir
from stitchfleet.compiler.kernel.uniformity import sub_exprs
from stitchfleet.compiler.targets.cuda.expr import C_TYPE, SPECIAL_NAME, SPECIAL_VALUE, RenderError
from stitchfleet.compiler.targets.cuda.scope import children, stmt_exprs

REGISTERS_PER_SM = 64 * 1024
MAX_THREADS_PER_SM = 2048  # sm_80 and sm_90 (sm_75/sm_86/sm_89 hold fewer: ptxas then ignores the minimum)
GRID_COUNTER = "sf_grid_counter"
_RESERVED = frozenset(
    [
        "auto",
        "bool",
        "break",
        "case",
        "char",
        "const",
        "continue",
        "default",
        "do",
        "double",
        "else",
        "enum",
        "extern",
        "float",
        "for",
        "goto",
        "if",
        "int",
        "long",
        "register",
        "return",
        "short",
        "signed",
        "sizeof",
        "static",
        "struct",
        "switch",
        "typedef",
        "union",
        "unsigned",
        "void",
        "volatile",
        "while",
        "class",
        "delete",
        "new",
        "operator",
        "private",
        "protected",
        "public",
        "template",
        "this",
        "throw",
        "try",
        "typename",
        "virtual",
        "namespace",
        "using",
        "true",
        "false",
        "nullptr",
    ]
)


@dataclass(frozen=True)
class CudaKernel:
    """A rendered kernel and how to launch it."""

    name: str
    source: str
    params: tuple[ir.Buffer, ...]
    launch: ir.Launch
    grid_barrier: bool
    dynamic_smem_bytes: int
    vector_loops: int


def check_names(kernel: ir.Kernel) -> None:
    names = [kernel.name, *(b.name for b in kernel.params), *(s.name for s in kernel.shared)]
    names += [v.name for v in _all_vars(kernel.body)]
    for name in names:
        if name in _RESERVED or name.startswith("sf_") or name.startswith("__"):
            raise RenderError(f"kernel {kernel.name!r}: name {name!r} is reserved in the rendered CUDA C")


def _all_vars(body: tuple[ir.Stmt, ...]) -> list[ir.Var]:
    found: list[ir.Var] = []
    for stmt in body:
        if isinstance(stmt, ir.Assign | ir.Shuffle | ir.For):
            found.append(stmt.var)
        for _, inner in children(stmt):
            found += _all_vars(inner)
    return found


def has_grid_sync(body: tuple[ir.Stmt, ...]) -> bool:
    return any(isinstance(s, ir.GridSync) or any(has_grid_sync(b) for _, b in children(s)) for s in body)


def param(buf: ir.Buffer) -> str:
    const = "const " if buf.role is ir.Role.INPUT else ""
    return f"{const}{C_TYPE[buf.dtype]}* __restrict__ {buf.name}"


def launch_bounds(launch: ir.Launch) -> str:
    if launch.max_registers is None:
        return f"__launch_bounds__({launch.block})"
    fit = min(REGISTERS_PER_SM // (launch.block * launch.max_registers), MAX_THREADS_PER_SM // launch.block)
    min_blocks = max(1, fit)
    return f"__launch_bounds__({launch.block}, {min_blocks})"


def specials(kernel: ir.Kernel) -> list[str]:
    used: set[ir.Special] = set()
    for stmt in statements(kernel.body):
        used |= {e.which for x in stmt_exprs(stmt) for e in sub_exprs(x) if isinstance(e, ir.SpecialIndex)}
    return [f"const long long {SPECIAL_NAME[s]} = {SPECIAL_VALUE[s]};" for s in ir.Special if s in used]


def statements(body: tuple[ir.Stmt, ...]) -> list[ir.Stmt]:
    out: list[ir.Stmt] = []
    for stmt in body:
        out.append(stmt)
        for _, inner in children(stmt):
            out += statements(inner)
    return out
