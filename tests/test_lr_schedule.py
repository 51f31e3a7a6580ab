"""TorchTrainable's learning-rate schedule and gradient clipping: the schedule's state hops
with the model, so a trial equals a plain loop and any worker count gives the same bits."""
from __future__ import annotations

import pytest
import torch
from _models import digits, make_model, scheduled

import cerebro as cb
from cerebro.data import read_layout, read_partition, sample_order
from cerebro.engine import init_seed, subepoch_seed


@pytest.mark.slow
@pytest.mark.parametrize("step", ["epoch", "batch"])
def test_a_scheduled_clipped_trial_on_one_partition_equals_a_plain_torch_loop(tmp_path, step):
    config, seed, epochs = {"lr": 0.1, "step": step}, 4, 3
    result = cb.GridSearch(scheduled, {k: cb.choice([v]) for k, v in config.items()}, epochs=epochs).fit(
        digits(partitions=1), backend=cb.LocalBackend(1, threads_per_worker=1), seed=seed, store=tmp_path / "run",
        verbose=0)
    data_dir = str(tmp_path / "run" / "data")
    features, label = (torch.from_numpy(a) for a in read_partition(data_dir, "train", 0))
    layout = read_layout(data_dir)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(init_seed(seed, "t0000"))
        plain = scheduled(config)
        for epoch in range(1, epochs + 1):
            batch_seed = subepoch_seed(seed, "t0000", epoch, 0)
            torch.manual_seed(batch_seed)
            order = torch.from_numpy(sample_order(layout.sample_order, batch_seed, len(features),
                                                  layout.row_group_rows, layout.window))
            for start in range(0, len(features), 16):
                rows = order[start:start + 16]
                plain.optimizer.zero_grad()
                plain.loss(plain.model(features[rows]), label[rows]).backward()
                torch.nn.utils.clip_grad_norm_(plain.model.parameters(), 0.5)
                plain.optimizer.step()
                if step == "batch":
                    plain.lr_scheduler.step()
            if step == "epoch":
                plain.lr_scheduler.step()
    finally:
        torch.set_num_threads(threads)
    trained = result.trials[0].state_dict("last")
    for name, tensor in plain.model.state_dict().items():
        assert torch.equal(trained[name], tensor), name


@pytest.mark.slow
def test_a_schedule_continues_exactly_across_hops_and_pbt_exploits(tmp_path):
    search = cb.PBT(scheduled, {"lr": cb.loguniform(0.02, 0.2)}, population=3, epochs=4, perturbation_interval=2)
    one, two = (search.fit(digits(partitions=4), workers=workers, store=tmp_path / str(workers), seed=1, verbose=0)
                for workers in (1, 2))
    assert one.history()["exploited_from"].notna().any()
    assert one.history().equals(two.history())
    for a, b in zip(one.trials, two.trials, strict=True):
        assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())


def test_bad_schedule_settings_are_refused():
    model = make_model("mlp")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    other = torch.optim.SGD(make_model("mlp").parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"^lr_scheduler_step='weekly' must be 'epoch' or 'batch'$"):
        cb.TorchTrainable(model, optimizer, torch.nn.functional.cross_entropy, 8,
                          lr_scheduler=torch.optim.lr_scheduler.StepLR(optimizer, 1), lr_scheduler_step="weekly")
    with pytest.raises(ValueError, match=r"^lr_scheduler schedules another optimizer"):
        cb.TorchTrainable(model, optimizer, torch.nn.functional.cross_entropy, 8,
                          lr_scheduler=torch.optim.lr_scheduler.StepLR(other, 1))
    with pytest.raises(ValueError, match=r"^clip_grad_norm=-1 must be a positive number or None$"):
        cb.TorchTrainable(model, optimizer, torch.nn.functional.cross_entropy, 8, clip_grad_norm=-1)


@pytest.mark.slow
def test_a_plateau_schedule_steps_on_the_epoch_befores_val_loss_the_same_on_any_worker_count(tmp_path):
    """ReduceLROnPlateau in "max" mode on val_loss: each epoch's learning rate (history's
    train_lr) is what the scheduler gives stepped on the recorded val_loss of the epochs
    before; 1 and 2 workers give the same bits; a PBT exploit carries the schedule over."""
    search = cb.GridSearch(scheduled, {"lr": cb.choice([0.1, 0.05]), "step": "plateau"}, epochs=4)
    one, two = (search.fit(digits(partitions=4), workers=workers, store=tmp_path / str(workers), seed=3, verbose=0)
                for workers in (1, 2))
    assert one.history().equals(two.history())
    for a, b in zip(one.trials, two.trials, strict=True):
        assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())
        rows = one.history()[lambda h, t=a.trial_id: h.trial_id == t].sort_values("epoch")
        optimizer = torch.optim.SGD(make_model("mlp").parameters(), lr=a.config["lr"])
        replayed = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", patience=0, factor=0.5)
        expected = [a.config["lr"]]
        for loss in rows["val_loss"].tolist()[:-1]:
            replayed.step(loss)
            expected.append(optimizer.param_groups[0]["lr"])
        assert rows["train_lr"].tolist() == expected and expected[-1] < expected[0]
    from cerebro.report._figures import learning_curves  # the report plots the rates
    assert "train_lr" in [panel.text for panel in learning_curves(one).layout.annotations]
    pbt = cb.PBT(scheduled, {"lr": cb.loguniform(0.02, 0.2), "step": "plateau"}, population=3, epochs=4,
                 perturbation_interval=2).fit(digits(partitions=4), workers=2, store=tmp_path / "pbt", seed=1,
                                              verbose=0)
    assert pbt.history()["exploited_from"].notna().any()
    assert [t.status for t in pbt.trials] == ["completed"] * 3
