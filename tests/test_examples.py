"""The example notebooks run from top to bottom, as a user runs them, in a folder of their own."""

from __future__ import annotations

import nbformat
import pytest
from conftest import REPO
from nbclient import NotebookClient

EXAMPLES = REPO / "examples"


def outputs_of(cell) -> str:
    """Everything a cell showed: streams, and each display's text, HTML and image types."""
    shown = []
    for output in cell.outputs:
        shown.append(output.get("text", ""))
        for kind, data in output.get("data", {}).items():
            shown.append(kind if kind.startswith("image/") else data)
    return "\n".join(shown)


@pytest.mark.slow
def test_reverse_notebook_runs_and_shows_progress_results_claims_and_attention(tmp_path):
    nb = nbformat.read(EXAMPLES / "reverse.ipynb", as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert not any(cell.outputs or cell.execution_count for cell in code)  # stored without outputs
    # "python3": ipykernel's own spec, which jupyter_client starts with this Python (sys.executable).
    client = NotebookClient(
        nb, kernel_name="python3", timeout=900, resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    shown = {cell.source.splitlines()[0]: outputs_of(cell) for cell in code}
    run = shown['study.run(workers=2, wandb="disabled")']
    # The progress bars, updated in place in the notebook, end with every trial done.
    assert "eval" in run and "6/6" in run, run[-2000:]
    table = shown["df = study.results()"]
    for variant in ("lstm", "lstm-bahdanau", "transformer"):
        assert f"<td>{variant}</td>" in table
    assert table.count("<td>COMPLETE</td>") == 6
    claims = shown["for c in study.claims():"]
    assert "Bahdanau attention lets an LSTM" in claims
    assert any(f"  {v}" in claims for v in ("reproduced", "contradicted", "inconclusive"))
    assert "image/png" in shown["from IPython.display import Image"]
    assert (tmp_path / "runs" / "reverse-attention" / "report" / "report.html").is_file()
