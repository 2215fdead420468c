"""TPT (Shu et al., "Test-Time Prompt Tuning for Zero-Shot Generalization in Vision-Language Models", NeurIPS
2022), as its official code runs it (azshue/TPT@16e2967, tpt_classification.py and clip/custom_clip.py, the
scripts' --tpt --ctx_init a_photo_of_a).

Episodic: per sample with views X [V, d] (view 0 the original image; the image encoder is frozen, so the cached
view features are its features):

1. the context ctx [4, w] is reset to the token embeddings of "a photo of a"; class k's prompt is
   [SOS] ctx [name_k] . [EOS] (CoOp's PromptLearner, class token at the end), its text feature t_k the text
   tower's output at the end token, L2-normalised;
2. a fresh torch.optim.AdamW (lr, torch's defaults otherwise: weight decay 0.01) takes `steps` steps on ctx,
   each minimising the entropy of the averaged softmax(s X_sel T^T) over the int(V * keep) views of lowest
   entropy, chosen once, at the first step (select_confident_samples, avg_entropy);
3. the posterior is softmax(s x_0 T^T) with the tuned context.

Where the official code and the paper or this port differ, this follows the code:
- Precision: the official code keeps CLIP's weights and the context in float32 (clip.load's convert_weights is
  commented out) and runs the forward and the loss under fp16 autocast, the backward through one
  GradScaler(init_scale=1000) made once and carried from sample to sample; here everything is float32, without
  autocast or a scaler (the scaled and unscaled gradients agree up to rounding).
- int(V * keep) views feed the loss, as the official select_confident_samples counts them (6 of 64 views).
  Where that is none (fewer than 10 views at keep 0.1) the official loss is the entropy of no view, NaN, with a
  zero gradient: AdamW's weight decay alone moves the context (by lr * 0.01 of itself a step). Such a run is
  refused (`selected_views`: a ValueError here, exit 2 in a sweep's validation) rather than run as
  something else; tests/test_tpt.py holds the count to the official one and the no-view step to what it does.
- s is the logit_scale hparam (CLIP's exp(logit_scale) = 100 for the released weights), not read from the
  backbone.
The class embeddings a sweep passes (from its template set) are not used: the class text features are TPT's
own, from its prompts through the text tower. Chunks of samples are solved in one text-tower pass per step
(`PromptTuning`), each sample exactly as alone.
"""

from __future__ import annotations

from orchestrator.methods.prompt import PromptTuning


class TPT(PromptTuning):
    """Test-time prompt tuning: entropy of the confident views' mean prediction, minimised on the context."""

    name = "tpt"
