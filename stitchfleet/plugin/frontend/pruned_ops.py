"""The ops of a training step that plain TF never runs: held out of clusters, so TF prunes them on the twin too.

Input: a `Conversion` and the TF ops some variable write reads through data edges (`training_steps.update_path`).
Output: `held`, IR node id -> reason, for the scope pass (`Options.held`): every node of a TF op off that path.
Rules: docs/plugin/frontend.md.
"""

from __future__ import annotations

from collections.abc import Collection

from stitchfleet.plugin.frontend.library_fusions import op_nodes
from stitchfleet.plugin.frontend.result import Conversion

REASON = "read by no variable write: grappler prunes it from plain TF's step (a cluster would compute it every step)"


def held(conversion: Conversion, updated: Collection[str]) -> dict[int, str]:
    """IR node id -> why it stays with TF, for each TF op of `conversion` outside `updated` (see the module
    docstring). A fetched value among them (the loss) is then TF's op, as in plain TF: nothing is computed twice."""
    found: dict[int, str] = {}
    for name, nodes in op_nodes(conversion).items():
        if name not in updated:
            found.update(dict.fromkeys(nodes, REASON))
    return found
