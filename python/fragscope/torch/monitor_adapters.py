"""The Monitor in PyTorch Lightning and Hugging Face training loops (docs/live-monitoring.md).

    from fragscope.torch.monitor_adapters import lightning_callback, huggingface_callback

    monitor = Monitor(run_dir=out)                      # action="stop" is set for you
    trainer = lightning.Trainer(callbacks=[lightning_callback(monitor)])
    trainer.fit(model)
    monitor.exit_if_stopped()                           # exit 75 so that torchrun restarts

    trainer = transformers.Trainer(..., callbacks=[huggingface_callback(monitor)])
    trainer.train()
    monitor.exit_if_stopped()

Nothing is imported until an adapter is asked for, and then only that framework: the
Lightning adapter subclasses lightning.pytorch.Callback (or pytorch_lightning.Callback), the
Hugging Face one transformers.TrainerCallback. Saving goes through the framework:
Lightning's trainer.save_checkpoint(<run_dir>/fragscope-step<N>.ckpt); for Hugging Face the
monitor sets control.should_save, and the Trainer writes its checkpoint-<N> right after
on_step_end.
"""
import importlib
import os


def _base(candidates, what):
    errors = []
    for module, name in candidates:
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as e:
            errors.append("{}.{}: {}".format(module, name, e))
    raise ImportError("{} is not installed ({})".format(what, "; ".join(errors)))


def _lightning_agreement(monitor, trainer):
    """The ranks agree through Lightning's strategy: every rank's (level, requested) by
    strategy.all_gather, and the decision to act by strategy.reduce_boolean_decision (any rank
    at the monitor's level, or a node's request). One device: no collective at all."""
    def agree(own, requested):
        if getattr(trainer, "world_size", 1) <= 1:
            return [(own, requested)]
        import torch
        strategy = trainer.strategy
        mine = torch.tensor([own, int(requested)], dtype=torch.int32)
        rows = strategy.all_gather(mine).reshape(-1, 2).tolist()
        levels = [(int(level), bool(req)) for level, req in rows]
        act = strategy.reduce_boolean_decision(own >= monitor.level or bool(requested), all=False)
        if act != any(level >= monitor.level or req for level, req in levels):
            raise RuntimeError("fragscope: the ranks' levels and Lightning's decision disagree")
        return levels
    return agree


def lightning_callback(monitor):
    """A Lightning Callback that runs monitor.step(trainer.global_step) after every training
    batch, the ranks agreeing through the strategy (all_gather, reduce_boolean_decision); at the
    agreed level it saves with trainer.save_checkpoint on every rank and sets
    trainer.should_stop (the Trainer then ends fit() cleanly: call monitor.exit_if_stopped())."""
    # Both packages may be installed, and each Trainer accepts only its own Callback class: the
    # callback derives from every one present, so it works with `lightning` and with
    # `pytorch_lightning` alike.
    bases = []
    for module in ("lightning.pytorch", "pytorch_lightning"):
        try:
            bases.append(getattr(importlib.import_module(module), "Callback"))
        except (ImportError, AttributeError):
            pass
    if not bases:
        _base((("lightning.pytorch", "Callback"), ("pytorch_lightning", "Callback")),
              "PyTorch Lightning")  # raises, naming what is missing
    monitor.action = "stop"

    class FragscopeLightningCallback(*bases):
        def __init__(self):
            super().__init__()
            self.monitor = monitor

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *rest):
            def save(step):
                path = os.path.join(monitor.run_dir, "fragscope-step{}.ckpt".format(step))
                trainer.save_checkpoint(path)
            monitor.save_checkpoint = save
            monitor.agree_with = _lightning_agreement(monitor, trainer)
            if monitor.step(int(trainer.global_step)):
                trainer.should_stop = True

    return FragscopeLightningCallback()


def huggingface_callback(monitor):
    """A transformers TrainerCallback that runs monitor.step(state.global_step) at every
    on_step_end; at the agreed level it sets control.should_save and
    control.should_training_stop (call monitor.exit_if_stopped() after trainer.train())."""
    TrainerCallback = _base((("transformers", "TrainerCallback"),), "Hugging Face transformers")
    monitor.action = "stop"

    class FragscopeTrainerCallback(TrainerCallback):
        def __init__(self):
            super().__init__()
            self.monitor = monitor

        def on_step_end(self, args, state, control, **kwargs):
            def save(_step):
                control.should_save = True  # the Trainer saves right after this callback
            monitor.save_checkpoint = save
            if monitor.step(int(state.global_step)):
                control.should_training_stop = True
            return control

    return FragscopeTrainerCallback()
