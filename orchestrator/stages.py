"""The stages a run's time is split into: one list for the methods' timers, the trial, the runs table and the
dashboard. A method's trace times its own stages; the trial adds the encoder's."""

METHOD_STAGES = ("logits", "posterior", "update")
ENCODER_STAGE = "encoder"
STAGES = (ENCODER_STAGE, *METHOD_STAGES)
STAGE_DOCS = {"encoder": "image encoding time (0 when features were cached)", "logits": "logits stage time",
              "posterior": "posterior stage time", "update": "update stage time"}


def stage_column(stage: str) -> str:
    """The runs-table column of a stage's seconds."""
    return f"time_{stage}_s"


STAGE_COLUMNS = tuple(stage_column(s) for s in STAGES)
