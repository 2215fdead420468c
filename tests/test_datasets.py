"""Dataset readers over tiny copies of every layout (orchestrator.clip.testing builds them)."""

from __future__ import annotations

import json

import pytest

from orchestrator.clip.testing import build_dataset
from orchestrator.data.datasets import DatasetLayoutError, imagenet_classnames, imagenet_wnids
from orchestrator.data.listing import read_dataset
from orchestrator.registry import CROSS_DOMAIN, OOD, canonical_dataset, dataset_card, group_datasets, paper_datasets


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    for name in paper_datasets():
        build_dataset(name, root, num_classes=3, per_class=6)
    return root


def test_paper_datasets_are_the_two_groups():
    assert set(paper_datasets()) == set(group_datasets(OOD)) | set(group_datasets(CROSS_DOMAIN))


@pytest.mark.parametrize("name", paper_datasets())
def test_every_layout_reads(data_root, name):
    images = read_dataset(name, data_root)
    assert len(images) == 18
    assert len(images.labels) == len(images.image_ids)
    assert all(0 <= label < images.num_classes for label in images.labels)
    assert all(images.path(i).is_file() for i in range(len(images)))
    assert all(not image_id.startswith("/") for image_id in images.image_ids)  # relative to the data root
    expected_k = {"imagenet": 1000, "imagenet-v2": 1000, "imagenet-sketch": 1000, "imagenet-a": 200,
                  "imagenet-r": 200}.get(name, 3)
    assert images.num_classes == expected_k


def test_wnid_tables():
    table = imagenet_wnids()
    assert len(table["imagenet"]) == 1000 == len(set(table["imagenet"]))
    assert table["imagenet"] == sorted(table["imagenet"])  # ImageNet's class order is sorted wnids
    for subset in ("imagenet-a", "imagenet-r"):
        assert len(table[subset]) == 200 and set(table[subset]) <= set(table["imagenet"])
    # the public code's index masks start like this
    position = {w: i for i, w in enumerate(table["imagenet"])}
    assert [position[w] for w in table["imagenet-a"][:6]] == [6, 11, 13, 15, 17, 22]
    assert [position[w] for w in table["imagenet-r"][:6]] == [1, 2, 4, 6, 8, 9]


@pytest.mark.parametrize("name", ["imagenet-a", "imagenet-r"])
def test_200_class_subsets_map_through_wnids(data_root, name):
    images = read_dataset(name, data_root)
    table = imagenet_wnids()
    names = imagenet_classnames()
    subset = table[name]
    assert images.class_names == [names[table["imagenet"].index(w)] for w in subset]
    # the fixture uses every other wnid of the subset: labels are subset positions, not folder positions
    assert sorted(set(images.labels)) == [1, 3, 5]
    for image_id, label in zip(images.image_ids, images.labels):
        wnid = image_id.split("/")[-2]
        assert subset[label] == wnid
    if name == "imagenet-a":
        assert images.class_names[0] == "stingray"  # ImageNet class 6


def test_imagenet_v2_folders_sort_as_numbers(data_root):
    images = read_dataset("imagenet-v2", data_root)
    folders = list(dict.fromkeys(image_id.split("/")[-2] for image_id in images.image_ids))
    assert folders == ["0", "2", "10"]  # string order would be 0, 10, 2
    for image_id, label in zip(images.image_ids, images.labels):
        assert label == int(image_id.split("/")[-2])
    assert images.class_names[10] == imagenet_classnames()[10]


@pytest.mark.parametrize("name", ["imagenet-a", "imagenet-r", "imagenet-sketch", "dtd"])
def test_files_with_sh_in_their_names_are_kept(data_root, name):
    images = read_dataset(name, data_root)
    files = {image_id.rsplit("/", 1)[-1].split(".")[0] for image_id in images.image_ids}
    assert {"sketch_0", "fish_1", "shadow_4"} <= files


def test_hidden_and_non_image_files_are_ignored(tmp_path):
    build_dataset("imagenet-a", tmp_path, num_classes=1, per_class=2)
    folder = next((tmp_path / "imagenet-adversarial" / "imagenet-a").iterdir())
    (folder / ".DS_Store").write_text("x")
    (folder / "README.txt").write_text("x")
    assert len(read_dataset("imagenet-a", tmp_path)) == 2


def test_eurosat_renames_and_underscores(data_root):
    images = read_dataset("eurosat", data_root)
    assert images.class_names == ["Annual Crop Land", "Herbaceous Vegetation Land", "Highway or Road"]
    assert read_dataset("dtd", data_root).class_names[0] == "class 0 name"


def test_aircraft_reads_variants_in_file_order(data_root):
    images = read_dataset("aircraft", data_root)
    assert images.class_names == ["707-100", "717-101", "727-102"]
    assert images.labels[:2] == [0, 0] and images.labels[-1] == 2


def test_aliases_and_protocol_views():
    assert canonical_dataset("A") == "imagenet-a"
    assert canonical_dataset("fgvc") == "aircraft"
    assert canonical_dataset("Oxford_Pets") == "pets"
    assert dataset_card("imagenet").views == "single"
    assert {dataset_card(n).views for n in ("imagenet-a", "imagenet-v2", "imagenet-r", "imagenet-sketch")} == {"augmix"}
    assert {dataset_card(n).views for n in group_datasets(CROSS_DOMAIN)} == {"single"}
    with pytest.raises(ValueError, match="unknown dataset 'cifar10'.*imagenet-a"):
        canonical_dataset("cifar10")


def test_missing_root_names_path_and_layout(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(DatasetLayoutError, match=f"data root {missing} does not exist.*imagenet-a/<wnid>"):
        read_dataset("imagenet-a", missing)


def test_missing_dataset_folder_names_expected_layout(tmp_path):
    with pytest.raises(DatasetLayoutError) as err:
        read_dataset("imagenet-r", tmp_path)
    assert str(tmp_path / "imagenet-rendition" / "imagenet-r") in str(err.value)
    assert "200 WordNet-id folders" in str(err.value)


def test_missing_split_file(tmp_path):
    build_dataset("caltech101", tmp_path)
    (tmp_path / "caltech-101" / "split_zhou_Caltech101.json").unlink()
    with pytest.raises(DatasetLayoutError, match="split_zhou_Caltech101.json does not exist.*CoOp split_zhou"):
        read_dataset("caltech101", tmp_path)


def test_missing_aircraft_test_list(tmp_path):
    build_dataset("aircraft", tmp_path)
    (tmp_path / "fgvc_aircraft" / "images_variant_test.txt").unlink()
    with pytest.raises(DatasetLayoutError, match="images_variant_test.txt does not exist"):
        read_dataset("aircraft", tmp_path)


def test_malformed_split_file(tmp_path):
    build_dataset("dtd", tmp_path)
    (tmp_path / "dtd" / "split_zhou_DescribableTextures.json").write_text(json.dumps({"train": []}))
    with pytest.raises(DatasetLayoutError, match="'test' list"):
        read_dataset("dtd", tmp_path)


def test_unknown_class_folder_is_named(tmp_path):
    build_dataset("imagenet-a", tmp_path, num_classes=1, per_class=1)
    (tmp_path / "imagenet-adversarial" / "imagenet-a" / "n01440764").mkdir()  # ImageNet class, not in -A
    with pytest.raises(DatasetLayoutError, match="n01440764"):
        read_dataset("imagenet-a", tmp_path)


def test_v2_rejects_non_numeric_folders(tmp_path):
    build_dataset("imagenet-v2", tmp_path, num_classes=1, per_class=1)
    (tmp_path / "imagenetv2" / "imagenetv2-matched-frequency-format-val" / "n01440764").mkdir()
    with pytest.raises(DatasetLayoutError, match="not classes of this dataset"):
        read_dataset("imagenet-v2", tmp_path)
