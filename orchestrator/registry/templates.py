"""The names of the prompt template sets (what each holds is `orchestrator.clip.prompts`): plain data, so a
spec's `templates` is checked without importing the CLIP stack."""

TEMPLATE_SET_NAMES = ("dataset", "ensemble7", "clip80", "handcrafted1", "handcrafted2", "handcrafted3", "handcrafted4",
                      "cupl", "tpt1", "watt8")
# A spec's `templates` value (its default) meaning each method's official set: the one its card names
# (`MethodCard.templates`), else the dataset's own. Runs record the set they used, never this name.
METHOD_TEMPLATES = "protocol"
