"""Prompt sets: builtin generation and file readers."""

from __future__ import annotations

import pytest

import argusdiff.config  # installs [traces], with ARGUSDIFF_TRACES__*, as traces.settings' source)
from traces.prompts import BUILTIN_KINDS, PromptSetError, builtin_prompts, load_prompts


def test_builtin_is_large_distinct_and_deterministic():
    a = builtin_prompts()
    assert len(a) >= 5000
    assert len(set(a.prompts)) == len(a)
    assert a.generated and a.categories is not None
    assert set(a.categories) == set(BUILTIN_KINDS)
    builtin_prompts.cache_clear()
    b = builtin_prompts()
    assert a.prompts == b.prompts and a.ids == b.ids
    assert load_prompts("builtin").prompts == a.prompts


def test_diffusiondb_is_the_default_set(monkeypatch):
    d = load_prompts(None)
    assert d.name == "diffusiondb" and not d.generated and "CC0" in d.source
    assert len(d) == 4999 and len(set(d.prompts)) < len(d)  # real users repeat prompts
    assert d.prompts == load_prompts("diffusiondb").prompts
    assert d.prompts[0].startswith("a renaissance portrait")
    monkeypatch.setenv("ARGUSDIFF_TRACES__PROMPTS", "builtin")
    assert load_prompts(None).generated


def test_traces_read_their_settings_from_the_installed_source(monkeypatch):
    """traces/ imports no configuration: it asks the source the application installs
    (argusdiff.config installs [traces]); with none it takes its defaults, which [traces]'s are."""
    from dataclasses import asdict, replace

    from traces import settings

    assert settings.traces_settings().prompts == "diffusiondb"  # argusdiff.config's source
    cfg = argusdiff.config.TracesConfig()
    assert {k: getattr(cfg, k) for k in asdict(settings.DEFAULTS)} == asdict(settings.DEFAULTS)
    monkeypatch.setattr(settings, "_source", None)
    monkeypatch.setenv("ARGUSDIFF_TRACES__PROMPTS", "builtin")
    assert settings.traces_settings() is settings.DEFAULTS and not load_prompts(None).generated
    settings.use_source(lambda: replace(settings.DEFAULTS, prompts="builtin"))
    assert load_prompts(None).generated


def test_text_file(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("a red fox \n\n  a cat on a mat\n")
    ps = load_prompts(f)
    assert ps.prompts == ("a red fox", "a cat on a mat")
    assert ps.ids == ("p-0", "p-1") and ps.categories is None


def test_parti_style_tsv(tmp_path):
    f = tmp_path / "parti.tsv"
    f.write_text(
        "Prompt\tCategory\tChallenge\tNote\nbond\tAbstract\tBasic\tx\na sign that says hi\tArts\tWriting & Symbols\t\n"
    )
    ps = load_prompts(f)
    assert ps.prompts == ("bond", "a sign that says hi")
    assert ps.categories == ("Abstract", "Arts")
    assert ps.challenges == ("Basic", "Writing & Symbols")


def test_csv_with_ids_and_metadata_lines(tmp_path):
    f = tmp_path / "q.csv"
    f.write_text('# metric: pickscore\nprompt_id,prompt,l0,l1\np1,"a fox, in snow",1,2\np2,a cat,1,2\n')
    ps = load_prompts(f)
    assert ps.ids == ("p1", "p2") and ps.prompts == ("a fox, in snow", "a cat")


def test_bad_prompt_files(tmp_path):
    with pytest.raises(PromptSetError, match="no such file"):
        load_prompts(tmp_path / "missing.txt")
    f = tmp_path / "e.txt"
    f.write_text("\n\n")
    with pytest.raises(PromptSetError, match="no prompts"):
        load_prompts(f)
    g = tmp_path / "g.tsv"
    g.write_text("Prompt\tCategory\nfox\tA\n\tB\n")
    with pytest.raises(PromptSetError, match=r"g\.tsv:3: empty prompt"):
        load_prompts(g)
    h = tmp_path / "h.csv"
    h.write_text("id,text\n1,a\n1,b\n")
    with pytest.raises(PromptSetError, match="duplicate prompt id '1'"):
        load_prompts(h)
    k = tmp_path / "k.csv"
    k.write_text("foo,bar\n1,2\n")
    with pytest.raises(PromptSetError, match=r"k\.csv:1: header has no 'prompt' column"):
        load_prompts(k)


def test_sample_and_subset():
    b = builtin_prompts()
    s = b.sample(100, seed=1)
    assert len(s) == 100 and len(set(s.ids)) == 100
    assert s.prompts == b.sample(100, seed=1).prompts
    assert b.head(3).prompts == b.prompts[:3]


def test_shared_prompt_sets(shared_dir):
    parti = load_prompts(shared_dir / "data" / "prompts" / "parti_prompts.tsv")
    assert len(parti) == 1632
    assert "Writing & Symbols" in set(parti.challenges)
    ddb = load_prompts(shared_dir / "data" / "prompts" / "diffusiondb_2m_first_5k.txt")
    assert len(ddb) >= 4990 and not ddb.generated
