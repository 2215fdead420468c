"""CLIPArTT (Hakim, Osowiechi et al., "CLIPArTT: Adaptation of CLIP to New Domains at Test Time", WACV 2025) on
CLIP's image encoder, as its official code runs it (dosowiechi/CLIPArTT@6f439ba models/tent.py forward_and_adapt
with target_method 1, adapt.py, configuration.py).

Per batch x of the stream (T: the unit class prototypes of the config's class embeddings, by default its template
"a photo of a {}", as adapt.py prompts each class): first, episodic runs restore the initial parameters and
optimiser state (the official runs reset before every batch); then `steps` times:
1. v = normalize(f(x)) through the adapted tower; each image's top_k classes c1..ck by softmax(s v T^T) (highest
   first) give its pseudo-caption "a photo of a c1 or c2 or ... ck" (getprompt), whose unit text feature is t
   (CLIP's frozen text tower);
2. logits = s t v^T [b captions, b images]; the target Q = softmax over each row of ((v v^T + t t^T) / 2) /
   temperature; loss = mean over images i of -sum_j Q[j, i] log softmax_j(logits^T)[i, j] (the official
   cross_entropy(logits.t(), targets.t())); backward; Adam steps;
and the batch is predicted after adapting, softmax(s normalize(f(x)) T^T) with the adapted tower (adapt.py's second
pass). The trace's `gated` marks every image (all of them shape the loss).

What it updates: the vision tower's norm layers, as collect_params takes them on model.visual: a ViT's LayerNorms, a
ResNet's BatchNorm2d (on the batch's statistics); the text tower stays frozen.

Which code this follows, and where it differs: the latest official code (models/tent.py, target_method 1: the
averaged image and caption similarities at temperature 0.01, the loss with a plus sign). An earlier version of the
repository (a root tent.py, since removed) minimised the negated loss without the temperature and captioned only the
images below a confidence threshold. The pseudo-labels of step 1 come from the same forward that the loss
backpropagates through (the official code runs that forward twice, once under no_grad, with the same parameters and
input, so the same values); the target Q is not detached, as in the official code. The class prompts and the
captions use the dataset's class names as prompted (`orchestrator.clip.prompts.prompt_text`). TTABC has no CLIPArTT.
Precision 'amp_fp16' autocasts the towers' forwards (CUDA fp16), the loss and the optimiser in float32; the official
code loads CLIP in fp16 on a GPU (clip.load), which this does not reproduce.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from orchestrator.methods.encoder import EncoderMethod
from orchestrator.methods.prompt import check_prompt_text


def caption(names: tuple[str, ...], classes: list[int]) -> str:
    """The pseudo-caption of an image's top classes (getprompt)."""
    return "a photo of a " + " or ".join(names[c] for c in classes)


def clipartt_loss(logits: torch.Tensor, image: torch.Tensor, captions: torch.Tensor,
                  temperature: float) -> torch.Tensor:
    """The official loss of the caption-image logits [b, b], the unit image features [b, d] and the unit caption
    features [b, d] (module docstring, step 2)."""
    targets = F.softmax(((image @ image.T + captions @ captions.T) / 2) / temperature, dim=-1)
    return (-targets.T * logits.T.log_softmax(dim=-1)).sum(1).mean()


class CLIPArTT(EncoderMethod):
    name = "clipartt"

    def __init__(self, class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int, *, vision: Any,
                 text: Any, **hparams: Any) -> None:
        self.prompts = check_prompt_text(self.name, text, num_classes, class_embeddings.device)
        if self.prompts.tokenizer is None or len(self.prompts.names) != num_classes:
            raise ValueError(f"{self.name}: writes pseudo-captions from the class names, so text must carry the "
                             f"backbone's tokenizer and the {num_classes} class names "
                             f"(orchestrator.clip.prompts.prompt_text builds it), got tokenizer "
                             f"{type(self.prompts.tokenizer).__name__} and {len(self.prompts.names)} names")
        super().__init__(class_embeddings, class_ids, num_classes, vision=vision, **hparams)

    @classmethod
    def check_hparams(cls, hp: dict[str, Any], num_embeddings: int, num_classes: int) -> dict[str, Any]:
        if hp["top_k"] > num_classes:
            raise ValueError(f"{cls.name}: hparam 'top_k' ({hp['top_k']}) names more classes in a pseudo-caption "
                             f"than there are ({num_classes}); expected top_k <= {num_classes}")
        return hp

    def make_optimizer(self, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.Adam(params, lr=self.hp["lr"], betas=(0.9, 0.999), weight_decay=0.0)

    def captions(self, top: torch.Tensor) -> torch.Tensor:
        """[b, d] unit text features of the images' pseudo-captions, their top classes [b, k] given."""
        tokens = self.prompts.tokenizer([caption(self.prompts.names, row) for row in top.tolist()]).to(top.device)
        tower = self.prompts.tower
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16,
                                             enabled=self.hp["precision"] == "amp_fp16"):
            features = tower(tower.embed(tokens), tokens.argmax(dim=-1))
        return F.normalize(features.float(), dim=-1)

    def adapt(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scale = self.hp["logit_scale"]
        for _ in range(self.hp["steps"]):
            with torch.autocast("cuda", dtype=torch.float16, enabled=self.hp["precision"] == "amp_fp16"):
                features = self.model(images)
            image = F.normalize(features.float(), dim=-1)
            top = (scale * image.detach() @ self.text.T).softmax(dim=-1).topk(self.hp["top_k"], 1, True, True)[1]
            captions = self.captions(top)
            loss = clipartt_loss(scale * captions @ image.T, image, captions, self.hp["temperature"])
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad()
        with torch.no_grad():
            return self.logits(images), torch.ones(images.shape[0], dtype=torch.bool, device=images.device)
