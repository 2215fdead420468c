"""What each method's official data loader feeds it on each of the 15 benchmark datasets, written from the loaders
themselves (plain data; `tests/test_official_protocols.py` holds every registered card to it, so a new built-in
method needs its row here, which `missing_rows` names, and a card cannot drift from its code).

A value is a views name (`orchestrator.registry.views`): 'single' (the CLIP eval transform alone), 'augmix' /
'crops' (63 augmented views + the original) or 'augmix31' / 'crops31' (31 + the original). Methods that take
one feature per sample name the views their features come from (AugMix views reduced to the confident views'
mean on ImageNet-A/-V2/-R/-Sketch).
"""

from __future__ import annotations

IMAGENET = ("imagenet",)
VARIANTS = ("imagenet-a", "imagenet-v2", "imagenet-r", "imagenet-sketch")
CROSS_DOMAIN = ("caltech101", "dtd", "eurosat", "aircraft", "food101", "flowers102", "pets", "cars", "sun397",
                "ucf101")
DATASETS = (*IMAGENET, *VARIANTS, *CROSS_DOMAIN)


def _by_group(imagenet: str, variants: str, cross_domain: str) -> dict[str, str]:
    return {**dict.fromkeys(IMAGENET, imagenet), **dict.fromkeys(VARIANTS, variants),
            **dict.fromkeys(CROSS_DOMAIN, cross_domain)}


# TDA's loader (kdiAAA/TDA@e697fb0 utils.py:127-139 build_test_data_loader): 'I' and the cross-domain sets the
# CLIP preprocess, 'A'/'V'/'R'/'S' get_ood_preprocess() (utils.py:94-103, AugMixAugmenter n_views=63 augmix=True).
# The BCA code and DOTA (skylineeeeen/DOTA@bc67d44 utils.py:156-168) use the same loader.
_TDA_LOADER = _by_group("single", "augmix", "single")

# TPT's rule `AugMixAugmenter(n_views=batch_size - 1, augmix=len(set_id) > 1)`: the one-letter set ids (ImageNet
# and its variants) get random resized crops + flips, the cross-domain sets AugMix.
OFFICIAL = {
    # CLIP zero-shot: the baseline of the BCA code, on its loader.
    "clip": ("BCA code, TDA's loader", _TDA_LOADER),
    "la": ("BCA code, TDA's loader", _TDA_LOADER),
    "pa": ("BCA code, TDA's loader", _TDA_LOADER),
    "bca": ("BCA code, TDA's loader", _TDA_LOADER),
    "tda": ("kdiAAA/TDA utils.py:127-139", _TDA_LOADER),
    "tda_pa": ("kdiAAA/TDA utils.py:127-139 (TDA's caches, BCA's prior)", _TDA_LOADER),
    "dota": ("skylineeeeen/DOTA utils.py:156-168", _TDA_LOADER),
    # OGA: runner.py encodes every test set with clip.load's preprocess (uti.load_features(..., preprocess, ...)),
    # ImageNet and the 10 cross-domain sets; the variants, which it does not run, take the dataset's own.
    "oga": ("cfuchs2023/OGA@26b6010 runner.py (clip.load's preprocess)", _TDA_LOADER),
    # OnZeta's code runs ImageNet only (main_online.py:218-224: clip.load's preprocess); elsewhere the dataset's own.
    "onzeta": ("idstcv/OnZeta main_online.py:218-224 (ImageNet only)", _TDA_LOADER),
    # ECALP: main.py reads pre-extracted features (made with DMN's code; the files are not in the repository, so
    # their loader cannot be read) and averages a view axis if they have one (iterative_label_propagation.py:
    # image_features.mean(dim=1)); it takes one feature per sample, so the dataset's own protocol, as TDA's loader.
    "ecalp": ("Yushu-Li/ECALP@96ddf0b main.py:20-24, utils/iterative_label_propagation.py", _TDA_LOADER),
    # DPE: utils.py:201-215 build_test_data_loader, 'I' and 'A'/'V'/'R'/'S' call get_preprocess() (utils.py:166-177,
    # AugMixAugmenter n_views=63 augmix=True); the cross-domain sets keep the CLIP preprocess.
    "dpe": ("zhangce01/DPE-CLIP@fecae5a utils.py:201-215", _by_group("augmix", "augmix", "single")),
    # TPS: shift_classification.py:98-99, TPT's rule with batch_size 64.
    "tps": ("elaine-sui/TPS@556db0f shift_classification.py:98-99", _by_group("crops", "crops", "augmix")),
    "ctpt": ("hee-suk-yoon/C-TPT@085e6c2 tpt_classification.py AugMixAugmenter(augmix=len(set_id) >= 1 with "
             "--I_augmix, as both scripts run it)", _by_group("augmix", "augmix", "augmix")),
    # O-TPT: otpt_classification.py:411-416, augmix=len(set_id) >= 1 with --I_augmix (the ImageNet script), else
    # len(set_id) > 1 (the fine-grained script, whose set ids are all longer than one letter): AugMix everywhere.
    "otpt": ("ashshaksharifdeen/O-TPT@a09933f otpt_classification.py:411-416",
             _by_group("augmix", "augmix", "augmix")),
    # A-TPT: tpt_classification.py and atpt_classification.py AugMixAugmenter, augmix=len(set_id) >= 1 with
    # --I_augmix (the ImageNet script), else len(set_id) > 1 (the fine-grained script): AugMix everywhere.
    "atpt": ("MB-Shihab-Aaqil-Ahamed/A-TPT@d76ecf6 tpt_classification.py, atpt_classification.py AugMixAugmenter",
             _by_group("augmix", "augmix", "augmix")),
    # RLCF: TPT's rule, batch_size 64 in both prompt scripts (args.augmix defaults to 1; the fine-grained script passes
    # `--augmix ${augmix}` without setting it, so it runs as written only with augmix set, to 1 for AugMix).
    "rlcf": ("mzhaoshuai/RLCF@0996a5d TPT/tpt_cls_rl.py:149-150 AugMixAugmenter(augmix=len(set_id)>1 and args.augmix)",
             _by_group("crops", "crops", "augmix")),
    "rtpt": ("TomSheng21/R-TPT@961483d rtpt.py AugMixAugmenter(augmix=len(dset) > 1)",
             _by_group("crops", "crops", "augmix")),
    # Tent, SAR, DeYO, BATCLIP, CLIPArTT and WATT: the official loaders' test transform, one image a sample (no test-time
    # augmentation); here the CLIP eval transform, as TTABC's loader gives its batch-wise methods.
    "tent": ("DequanWang/tent@7d236b4 (one test image a sample)", _by_group("single", "single", "single")),
    "sar": ("mr-eggplant/SAR@492c1ad main.py (one test image a sample)", _by_group("single", "single", "single")),
    "deyo": ("Jhyun17/DeYO@35ce821 main.py (one test image a sample)", _by_group("single", "single", "single")),
    "batclip": ("sarthaxxxxx/BATCLIP@7a3b716 classification (one test image a sample, the CLIP preprocess)",
                _by_group("single", "single", "single")),
    "clipartt": ("dosowiechi/CLIPArTT@6f439ba utils/prepare_dataset.py clip_transforms (one test image a sample)",
                 _by_group("single", "single", "single")),
    "watt": ("Mehrdad-Noori/WATT@40e3fae main.py (one test image a sample)", _by_group("single", "single", "single")),
    "tpt": ("azshue/TPT@16e2967 tpt_classification.py AugMixAugmenter(augmix=len(set_id) > 1)",
            _by_group("crops", "crops", "augmix")),
    # DynaPrompt: dynap_classification.py:252-253, TPT's rule with batch_size 64 (scripts/test_dynap.sh).
    "dynaprompt": ("zzzx1224/DynaPrompt@acd33cf dynap_classification.py:252-253 AugMixAugmenter(augmix=len(set_id) > 1)",
                   _by_group("crops", "crops", "augmix")),
    # HisTPT: its official code is the segmentation port (no classification loader); TTABC's CLIP port and this one
    # run it on TPT's path, TPT's rule with batch_size 64.
    "histpt": ("azshue/TPT@16e2967 tpt_classification.py AugMixAugmenter(augmix=len(set_id) > 1) (HisTPT's official "
               "code has no classification loader)", _by_group("crops", "crops", "augmix")),
    # DMN: dmn_main.py:419-420, TPT's rule with batch_size 32 (scripts/run.sh:12).
    "dmn_zs": ("YBZh/DMN@c6c218c dmn_main.py:419-420, scripts/run.sh:12", _by_group("crops31", "crops31", "augmix31")),
    # MCP: utils.py build_test_data_loader, 'I' and 'A'/'V'/'R'/'S' get_ood_preprocess() (AugMixAugmenter
    # n_views=31 augmix=False), the cross-domain sets get_preprocess() (n_views=31 augmix=True).
    **{m: ("CenturyChen/MCP@f9d063f utils.py build_test_data_loader", _by_group("crops31", "crops31", "augmix31"))
       for m in ("mcp", "mcp_pp")},
    # COSMIC: cosmic_main.py AugMixAugmenter(n_views=args.batch_size - 1, augmix=len(set_id) > 1) with -b 8
    # (scripts/cosmic_ood.sh, cosmic_cd.sh): 7 crops on ImageNet and its variants, 7 AugMix views elsewhere.
    "cosmic": ("hf618/COSMIC@34fde07 cosmic_main.py AugMixAugmenter, scripts/cosmic_ood.sh -b 8",
               _by_group("crops7", "crops7", "augmix7")),
    # DLAE: utils.py build_test_data_loader picks the transform dataset by dataset: get_preprocess(is_augmix=False)
    # (63 crops) on 'I', 'A', 'V', 'S' and ucf101, get_preprocess() (63 AugMix views) on 'R', dtd, fgvc,
    # stanford_cars, sun397 and food101, clip.load's preprocess on eurosat, oxford_pets, oxford_flowers, caltech101.
    "dlae": ("whynotcooper/dlae@253163b utils.py build_test_data_loader", {
        **_by_group("crops", "crops", "augmix"), "imagenet-r": "augmix", "ucf101": "crops",
        **dict.fromkeys(("eurosat", "pets", "flowers102", "caltech101"), "single")}),
    # ADAPT: data/datautils.py:33-50 build_test_loader, ImageNet-A/-Sketch/-R/-V2 get_ood_preprocess(63) (63 random
    # resized crops + flips and the original), ImageNet and the cross-domain sets clip.load's preprocess.
    "adapt": ("AIM-SKKU/ADAPT@68481c0 data/datautils.py:33-50", _by_group("single", "crops", "single")),
    # FreeTTA: no official code; one feature a sample, on the datasets' own protocol (TDA's loader), the field's
    # benchmark its paper reports on.
    "freetta": ("no official code (from the paper); the datasets' own protocol", _TDA_LOADER),
    # MTA: main.py:172-173 augmix=(len(set_id) > 1 and args.tpt): crops everywhere without --tpt.
    "mta": ("MaxZanella/MTA@cafafdf main.py:172-173", _by_group("crops", "crops", "crops")),
    # BoostAdapter: utils.py:155-168, 'I' the CLIP preprocess; the others AugMixAugmenter(augmix=False)
    # (utils.py:122 and 131).
    "boostadapter": ("taolinzhang/BoostAdapter@9983e1a utils.py:122,131,155-168", _by_group("single", "crops", "crops")),
    # Zero: data/augs.py:57-67 get_transforms, MultiViewCropAndFlip (augs.py:43) on every dataset.
    "zero": ("FarinaMatteo/zero data/augs.py:43,57-67", _by_group("crops", "crops", "crops")),
    # PromptAlign's AugMixAugmenter keeps an empty aug_list whatever its augmix argument: crops everywhere.
    "promptalign": ("jameelhassan/PromptAlign@9290564 trainers/prompt_align.py AugMixAugmenter, "
                    "get_tpt_dataloader (n_views=TPT.BATCH_SIZE - 1)", _by_group("crops", "crops", "crops")),
    # StatA's harness (its own method and the TransCLIP and ZLaP solvers it compares): datasets/__init__.py
    # get_all_dataloaders, clip.load's preprocess on every dataset.
    **{m: ("MaxZanella/StatA@eea8637 datasets/__init__.py:40-58", _by_group("single", "single", "single"))
       for m in ("stata", "transclip", "zlap")},
}


def missing_rows(builtin: list[str]) -> list[str]:
    """What the table lacks for the built-in methods `builtin`, or holds for none of them: one line each."""
    return [*(f"{m}: no row in tests/official_protocols.py OFFICIAL; add (its official loader's file and lines, the "
              f"views it feeds on each of the {len(DATASETS)} datasets)" for m in sorted(set(builtin) - set(OFFICIAL))),
            *(f"{m}: a row in tests/official_protocols.py OFFICIAL but no built-in card; remove it"
              for m in sorted(set(OFFICIAL) - set(builtin)))]
