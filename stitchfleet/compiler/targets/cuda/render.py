"""The CUDA C renderer: one kernel IR `Kernel` -> one self-contained CUDA C translation unit.

Input: a verified `Kernel`. Output: `CudaKernel`: the source (`extern "C"` entry named
like the kernel, prelude included), the parameter order the launcher passes device
pointers in, and what the launch needs (grid barrier counter, dynamic shared memory).
Pure string generation: no CUDA toolkit or pycuda needed. The kernel head (names, parameters,
launch bounds, index variables) and `CudaKernel` are in signature.py.

- Variables are declared at the top of their scope (scope.py), loop counters in
  their `for` header. Inputs are `const T* __restrict__` (every buffer is its own
  allocation, so they never alias), the others `T* __restrict__`.
- Element-wise stride loops whose accesses are provably contiguous and aligned read
  and write whole vectors (vector.py); the rest is scalar.
- Warp shuffles use the mask of the lanes that are really there: all 32 at
  warp-uniform control flow, `__ballot_sync` of the branch condition under a
  lane-divergent `if`. A shuffle in a loop with lane-divergent bounds is refused.
- Shared memory (shared.py): static arrays, arena views as typed pointers into one
  byte array; beyond 48 KiB one `extern __shared__` array carved into the buffers,
  whose size the launcher passes and raises the function's limit to.
- `GridSync` -> `sf_grid_sync(sf_grid_counter)`, a hand-written barrier (see the
  prelude for why): the launcher appends a zeroed counter as the last parameter.
- `__launch_bounds__(block, min_blocks)` where min_blocks makes the planner's register
  cap hold on a 64K-register SM (every arch from sm_70 to sm_90 has 64K).
- Stores into the buffers named `nonfinite` (a program's floating op outputs) go through
  `sf_checked`, which notes a NaN/Inf in the cluster's flag while the value is in a register.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from stitchfleet.compiler.ir.types import DType, Op
from stitchfleet.compiler.kernel import ir
from stitchfleet.compiler.kernel.verify import verify
from stitchfleet.compiler.targets.cuda.expr import (
    C_TYPE,
    ExprRenderer,
    RenderError,
)
from stitchfleet.compiler.targets.cuda.prelude import PRELUDE
from stitchfleet.compiler.targets.cuda.scope import BlockId, Declarations, children, declarations, stmt_exprs
from stitchfleet.compiler.targets.cuda.shared import shared_lines
from stitchfleet.compiler.targets.cuda.signature import (
    GRID_COUNTER,
    CudaKernel,
    check_names,
    has_grid_sync,
    launch_bounds,
    param,
    specials,
    statements,
)
from stitchfleet.compiler.targets.cuda.vector import VARIANT, KernelFacts, VectorPlan, plan_vector

FULL_MASK = "0xffffffffu"
_ATOMIC = {Op.ADD: "sf_atomic_add", Op.MAXIMUM: "sf_atomic_max", Op.MINIMUM: "sf_atomic_min"}
_INDENT = "  "


@dataclass
class _State:
    kernel: ir.Kernel
    decls: Declarations
    facts: KernelFacts
    lines: list[str] = field(default_factory=list)
    checked: frozenset[str] = frozenset()  # buffers whose stored values note NaN/Inf (sf_checked)
    masks: int = 0
    vector_loops: int = 0


@dataclass(frozen=True)
class _Where:
    block: BlockId
    depth: int
    mask: str
    uniform: frozenset[ir.Special]
    exprs: ExprRenderer


def _emit(state: _State, where: _Where, text: str) -> None:
    state.lines.append(_INDENT * where.depth + text)


def _declare(state: _State, where: _Where) -> None:
    for var in state.decls.at(where.block):
        _emit(state, where, f"{C_TYPE[var.dtype]} {var.name};")


def _body(state: _State, body: tuple[ir.Stmt, ...], where: _Where) -> None:
    _declare(state, where)
    for i, stmt in enumerate(body):
        _stmt(state, stmt, i, where)


def _inner(where: _Where, i: int, branch: str, **changes: object) -> _Where:
    fields = {
        "block": (*where.block, (i, branch)),
        "depth": where.depth + 1,
        "mask": where.mask,
        "uniform": where.uniform,
        "exprs": where.exprs,
    }
    fields.update(changes)
    return _Where(**fields)  # type: ignore[arg-type]


def _still_uniform(state: _State, where: _Where, exprs: tuple[ir.Expr, ...]) -> frozenset[ir.Special]:
    return frozenset(g for g in where.uniform if all(state.facts.uniform(g, e) for e in exprs))


def _has_shuffle(body: tuple[ir.Stmt, ...]) -> bool:
    return any(isinstance(s, ir.Shuffle) or any(_has_shuffle(b) for _, b in children(s)) for s in body)


def _if(state: _State, stmt: ir.If, i: int, where: _Where) -> None:
    x = where.exprs
    uniform = _still_uniform(state, where, (stmt.cond,))
    then_mask, else_mask = where.mask, where.mask
    cond = x.text(stmt.cond)
    if ir.Special.LANE not in uniform and _has_shuffle(stmt.then + stmt.orelse):
        state.masks += 1
        flag, mask = f"sf_cond_{state.masks}", f"sf_mask_{state.masks}"
        _emit(state, where, f"const bool {flag} = {cond};")
        _emit(state, where, f"const unsigned {mask} = __ballot_sync({where.mask}, {flag});")
        cond, then_mask, else_mask = flag, mask, f"({where.mask} & ~{mask})"
    _emit(state, where, f"if ({cond}) {{")
    _body(state, stmt.then, _inner(where, i, "then", mask=then_mask, uniform=uniform))
    if stmt.orelse:
        _emit(state, where, "} else {")
        _body(state, stmt.orelse, _inner(where, i, "else", mask=else_mask, uniform=uniform))
    _emit(state, where, "}")


def _for(state: _State, stmt: ir.For, i: int, where: _Where) -> None:
    x = where.exprs
    uniform = _still_uniform(state, where, (stmt.start, stmt.stop, stmt.step))
    if ir.Special.LANE not in uniform and _has_shuffle(stmt.body):
        raise RenderError(
            f"kernel {state.kernel.name!r}: loop over {stmt.var.name!r} has lane-divergent bounds and contains a "
            "warp shuffle: no shuffle mask is valid for every iteration"
        )
    plan = plan_vector(stmt, state.kernel, where.uniform, state.facts)
    if plan is not None:
        _vector_for(state, stmt, i, where, plan)
        return
    v = stmt.var.name
    inner = _inner(where, i, "body", uniform=uniform)
    decl = f"{C_TYPE[stmt.var.dtype]} " if inner.block in state.decls.headers else ""
    _emit(
        state,
        where,
        f"for ({decl}{v} = {x.text(stmt.start)}; {v} < {x.text(stmt.stop)}; {v} += {x.text(stmt.step)}) {{",
    )
    _body(state, stmt.body, inner)
    _emit(state, where, "}")


def _vec_type(buf: ir.Buffer, lanes: int) -> str:
    return f"sf_vec<{C_TYPE[buf.dtype]}, {lanes}>"


def _vector_for(state: _State, stmt: ir.For, i: int, where: _Where, plan: VectorPlan) -> None:
    state.vector_loops += 1
    x, v, n = where.exprs, stmt.var.name, plan.lanes
    base = f"{v}_v"
    _emit(state, where, f"// {n} elements per thread: {', '.join(b.name for b in plan.loads + plan.stores)} as vectors")
    _emit(
        state,
        where,
        f"for (long long {base} = {x.text(plan.start)}; {base} < {x.text(stmt.stop)}; "
        f"{base} += {x.text(plan.step)}) {{",
    )
    pad = _inner(where, i, "vector")
    for b in plan.loads:
        _emit(
            state,
            pad,
            f"const {_vec_type(b, n)} {b.name}_v = *reinterpret_cast<const {_vec_type(b, n)}*>({b.name} + {base});",
        )
    for b in plan.stores:
        _emit(state, pad, f"{_vec_type(b, n)} {b.name}_v;")
    _emit(state, pad, "#pragma unroll")
    _emit(state, pad, f"for (int {v}_k = 0; {v}_k < {n}; ++{v}_k) {{")
    lane = {(b.name, stmt.var): f"{b.name}_v.v[{v}_k]" for b in plan.loads}
    inner = _Where((*where.block, (i, "body")), where.depth + 2, where.mask, where.uniform, ExprRenderer(lane))
    if _lane_needs_index(stmt, plan):
        _emit(state, inner, f"const long long {v} = {base} + {v}_k;")
    _declare(state, inner)
    stores = {b.name for b in plan.stores}
    for j, s in enumerate(stmt.body):
        if isinstance(s, ir.Store) and s.buffer.name in stores:
            _emit(state, inner, f"{s.buffer.name}_v.v[{v}_k] = {_stored(state, s.buffer, inner.exprs.text(s.value))};")
        else:
            _stmt(state, s, j, inner)
    _emit(state, pad, "}")
    for b in plan.stores:
        _emit(state, pad, f"*reinterpret_cast<{_vec_type(b, n)}*>({b.name} + {base}) = {b.name}_v;")
    _emit(state, where, "}")


def _lane_needs_index(loop: ir.For, plan: VectorPlan) -> bool:
    """Whether the loop body uses its counter other than as the index of a vector access."""
    vector = {b.name for b in plan.loads + plan.stores}
    for stmt in statements(loop.body):
        exprs = list(stmt_exprs(stmt))
        if isinstance(stmt, ir.Store) and stmt.buffer.name in vector:
            exprs = [stmt.value]
        for e in (p for x in exprs for p in _outside_vector_loads(x, vector)):
            if e == loop.var:
                return True
    return False


def _outside_vector_loads(e: ir.Expr, vector: set[str]) -> list[ir.Expr]:
    if isinstance(e, ir.Load) and e.buffer.name in vector:
        return []
    parts: list[ir.Expr] = [e]
    match e:
        case ir.Unary(x=x) | ir.Cast(x=x):
            parts += _outside_vector_loads(x, vector)
        case ir.Binary(a=a, b=b):
            parts += _outside_vector_loads(a, vector) + _outside_vector_loads(b, vector)
        case ir.Select(cond=c, a=a, b=b):
            parts += [q for y in (c, a, b) for q in _outside_vector_loads(y, vector)]
        case ir.Load(index=index):
            parts += _outside_vector_loads(index, vector)
    return parts


def _shuffle(state: _State, stmt: ir.Shuffle, where: _Where) -> None:
    value = where.exprs.text(stmt.value)
    if stmt.var.dtype is DType.BOOL:
        value = f"static_cast<int>({value})"
    call = f"__shfl_{stmt.mode.value}_sync({where.mask}, {value}, {stmt.offset}, {stmt.width})"
    _emit(state, where, f"{stmt.var.name} = {call}{' != 0' if stmt.var.dtype is DType.BOOL else ''};")


def _stmt(state: _State, stmt: ir.Stmt, i: int, where: _Where) -> None:
    x = where.exprs
    match stmt:
        case ir.Assign(var=var, value=value):
            _emit(state, where, f"{var.name} = {x.text(value)};")
        case ir.Store(buffer=buf, index=index, value=value):
            _emit(state, where, f"{buf.name}[{x.text(index)}] = {_stored(state, buf, x.text(value))};")
        case ir.Atomic(op=op, buffer=buf, index=index, value=value):
            _emit(state, where, f"{_ATOMIC[op]}(&{buf.name}[{x.text(index)}], {x.text(value)});")
        case ir.For():
            _for(state, stmt, i, where)
        case ir.If():
            _if(state, stmt, i, where)
        case ir.SyncThreads():
            _emit(state, where, "__syncthreads();")
        case ir.GridSync():
            _emit(state, where, f"sf_grid_sync({GRID_COUNTER});")
        case ir.Shuffle():
            _shuffle(state, stmt, where)
        case ir.Comment(text=text):
            for line in text.splitlines() or [""]:
                _emit(state, where, f"// {line}")


def _stored(state: _State, buf: ir.AnyBuffer, value: str) -> str:
    """A stored value, through `sf_checked` when the buffer is an op output whose NaN/Inf is noted."""
    return f"sf_checked({value})" if buf.name in state.checked and buf.dtype.is_float else value


def render_kernel(kernel: ir.Kernel, nonfinite: frozenset[str] = frozenset()) -> CudaKernel:
    """The kernel as CUDA C; KernelError if it does not verify, RenderError if it cannot be expressed.
    Stores into the global buffers named in `nonfinite` note a NaN/Inf in the cluster's flag."""
    verify(kernel)
    check_names(kernel)
    barrier = has_grid_sync(kernel.body)
    params = [param(b) for b in kernel.params] + ([f"unsigned int* __restrict__ {GRID_COUNTER}"] if barrier else [])
    checked = frozenset(b.name for b in kernel.params if b.name in nonfinite and b.role is ir.Role.OUTPUT)
    state = _State(kernel, declarations(kernel.body), KernelFacts.of(kernel), checked=checked)
    shared, dynamic = shared_lines(kernel)
    where = _Where((), 1, FULL_MASK, frozenset(VARIANT), ExprRenderer())
    head = [PRELUDE, f"// kernel {kernel.name}: grid {kernel.launch.grid} x block {kernel.launch.block}"]
    head += [f"// {line}" for line in kernel.doc.splitlines()]
    head.append(f'extern "C" __global__ void {launch_bounds(kernel.launch)} {kernel.name}(')
    head.append(",\n".join(f"{_INDENT * 2}{p}" for p in params) + ") {")
    state.lines += [*head, *(_INDENT + line for line in specials(kernel) + shared)]
    _body(state, kernel.body, where)
    state.lines.append("}")
    source = "\n".join(state.lines) + "\n"
    return CudaKernel(kernel.name, source, kernel.params, kernel.launch, barrier, dynamic, state.vector_loops)


def render_program(
    kernels: tuple[ir.Kernel, ...] | list[ir.Kernel], nonfinite: frozenset[str] = frozenset()
) -> tuple[CudaKernel, ...]:
    """Every kernel of a program, in launch order (one translation unit each)."""
    return tuple(render_kernel(k, nonfinite) for k in kernels)


def kernel_text(rendered: CudaKernel) -> str:
    """The rendered source without the shared prelude (what snapshots and reviews look at)."""
    return rendered.source.removeprefix(PRELUDE)


def render_module(kernels: tuple[ir.Kernel, ...] | list[ir.Kernel], nonfinite: frozenset[str] = frozenset()) -> str:
    """One translation unit holding several kernels (names must differ): the prelude once, then each kernel
    (a cluster's module, with `nonfinite` its checked op outputs, or many kernels for one nvcc run)."""
    return module_text([render_kernel(k, nonfinite) for k in kernels])


def module_text(rendered: Sequence[CudaKernel]) -> str:
    """`render_module`'s unit from kernels already rendered (a launch plan renders each kernel once, not twice)."""
    names = [k.name for k in rendered]
    if len(set(names)) != len(names):
        raise RenderError(
            f"kernel names must be unique in one module: {sorted(n for n in names if names.count(n) > 1)}"
        )
    return PRELUDE + "".join(kernel_text(k) for k in rendered)
