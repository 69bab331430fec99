"""A Hugging Face ``transformers.Trainer`` script as its users write one: a checkpoint
in OUT/trainer every SAVE_EVERY steps (``save_strategy="steps"``), and
``trainer.train(resume_from_checkpoint=get_last_checkpoint(...))``; the Trainer's
default optimizer (AdamW). It knows nothing of the launcher but torchrun's RANK /
LOCAL_RANK / WORLD_SIZE, on CPU over gloo.

A tiny regression model on a fixed synthetic data set of 4 batches per rank and epoch;
the Trainer's own resume skips the batches an interrupted epoch had done. A callback on
global rank 0 notes in OUT/steps.jsonl, one JSON line each, flushed as it goes: where
each run began (``resumed``: the global step of the checkpoint it resumed from, 0 for a
fresh start, and the parameters it starts from), every optimizer step it completed with
its time, the parameters after it, and the parameters at the end. The run is
``SLURM_RESTART_COUNT`` (absent, so 0, on the first).

Usage: own_hf_trainer.py OUT [--steps 30] [--save-every 10] [--step-time 0.25]
"""

import argparse
import json
import os
import time

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint


class Regression(torch.nn.Module):
    def __init__(self, step_time):
        super().__init__()
        self.linear = torch.nn.Linear(8, 1)
        self.step_time = step_time

    def forward(self, x, labels=None):
        time.sleep(self.step_time)  # stands for the real work of a step
        out = self.linear(x)
        loss = torch.nn.functional.mse_loss(out, labels)
        return {"loss": loss, "logits": out}


class Steps(TrainerCallback):
    """Rank 0's note of each run's start, of every optimizer step and of the end."""

    def __init__(self, path, resumed):
        self.path = path
        self.resumed = resumed
        self.run = int(os.environ.get("SLURM_RESTART_COUNT", "0"))

    def note(self, state, **fields):
        if state.is_world_process_zero:
            with open(self.path, "a") as notes:
                notes.write(json.dumps({"run": self.run, **fields, "t": time.time()}) + "\n")

    def params(self, model):
        return [x for p in model.parameters() for x in p.detach().flatten().tolist()]

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        world = int(os.environ.get("WORLD_SIZE", "1"))
        self.note(state, resumed=self.resumed, world_size=world, params=self.params(model))

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.note(state, step=state.global_step, params=self.params(model))

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self.note(state, done=state.global_step, params=self.params(model))


def data_set(size):
    data = torch.Generator().manual_seed(0)
    x = torch.randn(size, 8, generator=data)
    y = torch.sin(x.sum(1, keepdim=True))
    return [{"x": x[i], "labels": y[i]} for i in range(size)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--step-time", type=float, default=0.25)
    args = parser.parse_args()
    output_dir = os.path.join(args.out, "trainer")
    training_args = TrainingArguments(
        output_dir=output_dir,
        max_steps=args.steps,
        per_device_train_batch_size=4,
        learning_rate=0.01,
        save_strategy="steps",
        save_steps=args.save_every,
        logging_strategy="no",
        report_to="none",
        use_cpu=True,
        ddp_backend="gloo",
        ddp_find_unused_parameters=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=0,
    )
    last = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
    resumed = int(last.rsplit("-", 1)[1]) if last else 0
    torch.manual_seed(0)
    model = Regression(args.step_time)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=data_set(16 * world),
        callbacks=[Steps(os.path.join(args.out, "steps.jsonl"), resumed)],
    )
    trainer.train(resume_from_checkpoint=last)


if __name__ == "__main__":
    main()
