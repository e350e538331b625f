"""A TensorFlow job as a TFJob user writes it: a small classifier of scikit-learn's digits,
trained across the processes ``TF_CONFIG`` names.

Nothing in it knows tidal: the cluster, this process's task type and index come from
``TF_CONFIG`` (the TFJob operator writes it; tidal's ``tf`` launcher writes the same). A
cluster with ``ps`` tasks trains with ``ParameterServerStrategy`` (workers and parameter
servers serve until they are stopped; the chief drives the training); one without trains
with ``MultiWorkerMirroredStrategy`` (every task trains and exits). Without ``TF_CONFIG``
it trains on one process. The chief (or worker 0 when there is no chief) writes a JSON
summary to ``--out`` when given.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

# TensorFlow's C++ start-up chatter (CPU feature notes) would bury the job's own log.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler


def task() -> tuple[str, int, dict[str, list[str]]]:
    """This process's task type, index and the cluster, from ``TF_CONFIG``."""
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    cluster: dict[str, list[str]] = config.get("cluster", {})
    task = config.get("task", {})
    return str(task.get("type", "worker")), int(task.get("index", 0)), cluster


def is_chief(kind: str, index: int, cluster: dict[str, list[str]]) -> bool:
    """TensorFlow's rule: the chief task, or worker 0 when the cluster has no chief."""
    return kind == "chief" or (kind == "worker" and index == 0 and "chief" not in cluster)


class Classifier(tf.Module):  # type: ignore[misc]
    """64 pixels → 64 hidden units → 10 logits."""

    def __init__(self) -> None:
        """Glorot-initialised weights (seeded by ``set_random_seed``)."""
        super().__init__()
        init = tf.keras.initializers.GlorotUniform()
        self.w1 = tf.Variable(init((64, 64)))
        self.b1 = tf.Variable(tf.zeros(64))
        self.w2 = tf.Variable(init((64, 10)))
        self.b2 = tf.Variable(tf.zeros(10))

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        """The logits of ``x``."""
        return tf.nn.relu(x @ self.w1 + self.b1) @ self.w2 + self.b2


def load(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Standardised digits, split 80/20: train x, train y, test x, test y."""
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=seed, stratify=y
    )
    scaler = StandardScaler().fit(x_train)
    return (
        scaler.transform(x_train).astype(np.float32),
        y_train.astype(np.int64),
        scaler.transform(x_test).astype(np.float32),
        y_test,
    )


def train_mirrored(args: argparse.Namespace, data: tuple[np.ndarray, ...]) -> list[float]:
    """Synchronous all-reduce training on every task; the per-epoch mean losses."""
    x_train, y_train = data[0], data[1]
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    # Every task reads the same data; the strategy splits each global batch by replica.
    train = (
        tf.data.Dataset.from_tensor_slices((x_train, y_train))
        .shuffle(len(x_train), seed=args.seed, reshuffle_each_iteration=True)
        .batch(args.batch, drop_remainder=True)
    )
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    batches = strategy.experimental_distribute_dataset(train.with_options(options))
    with strategy.scope():
        model = Classifier()
        optimizer = tf.keras.optimizers.Adam(1e-2)

    def replica_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            per_sample = tf.nn.sparse_softmax_cross_entropy_with_logits(y, model(x))
            # Averaged over the global batch: the replicas' gradients are then summed.
            loss = tf.nn.compute_average_loss(per_sample, global_batch_size=args.batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    @tf.function  # type: ignore[untyped-decorator]
    def step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        losses = strategy.run(replica_step, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    epoch_losses: list[float] = []
    for _ in range(args.epochs):
        total, count = 0.0, 0
        for x, y in batches:
            total += float(step(x, y))
            count += 1
        epoch_losses.append(total / max(count, 1))
    args.model = model
    args.replicas = strategy.num_replicas_in_sync
    return epoch_losses


def train_with_parameter_servers(
    args: argparse.Namespace, data: tuple[np.ndarray, ...]
) -> list[float]:
    """The chief's side of ``ParameterServerStrategy``: variables live on the ``ps``
    tasks, the chief schedules steps onto the workers; the per-epoch mean losses."""
    x_train, y_train = data[0], data[1]
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = Classifier()

    def dataset_fn() -> tf.data.Dataset:
        return (
            tf.data.Dataset.from_tensor_slices((x_train, y_train))
            .shuffle(len(x_train), seed=args.seed, reshuffle_each_iteration=True)
            .batch(args.batch, drop_remainder=True)
            .repeat()
        )

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    lr = tf.constant(0.1)

    @tf.function  # type: ignore[untyped-decorator]
    def step(batches: tf.data.Iterator) -> tf.Tensor:
        def replica_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                per_sample = tf.nn.sparse_softmax_cross_entropy_with_logits(y, model(x))
                loss = tf.reduce_mean(per_sample)
            grads = tape.gradient(loss, model.trainable_variables)
            # Plain SGD, applied on the parameter servers that hold each variable.
            for variable, grad in zip(model.trainable_variables, grads, strict=True):
                variable.assign_sub(lr * grad)
            return loss

        x, y = next(batches)
        return strategy.run(replica_step, args=(x, y))

    steps = len(x_train) // args.batch
    epoch_losses: list[float] = []
    for _ in range(args.epochs):
        results = [coordinator.schedule(step, args=(iterator,)) for _ in range(steps)]
        coordinator.join()
        epoch_losses.append(float(np.mean([r.fetch() for r in results])))
    args.model = model
    args.replicas = len(resolver.cluster_spec().as_dict().get("worker", []))
    return epoch_losses


def main() -> None:
    """Train, evaluate, and (on the chief) write the summary."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64, help="global batch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    kind, index, cluster = task()
    tf.keras.utils.set_random_seed(args.seed)
    if "ps" in cluster and kind in ("worker", "ps"):
        # A worker or parameter server of ParameterServerStrategy only serves: the chief
        # runs the program, and the job ends with the chief (TFJob's success policy).
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        server = tf.distribute.Server(
            resolver.cluster_spec(), job_name=kind, task_index=index, protocol="grpc"
        )
        print(f"task={kind}:{index} serving", flush=True)
        server.join()
        return
    data = load(args.seed)
    if "ps" in cluster:
        epoch_losses = train_with_parameter_servers(args, data)
    else:
        epoch_losses = train_mirrored(args, data)
    for epoch, loss in enumerate(epoch_losses):
        print(f"task={kind}:{index} epoch={epoch} loss={loss:.4f}", flush=True)
    logits = args.model(tf.constant(data[2])).numpy()
    accuracy = float(np.mean(np.argmax(logits, axis=1) == data[3]))
    strategy = "parameter-server" if "ps" in cluster else "mirrored"
    print(
        f"task={kind}:{index} strategy={strategy} replicas={args.replicas} accuracy={accuracy:.4f}",
        flush=True,
    )
    if args.out is not None and is_chief(kind, index, cluster):
        summary = {
            "task": f"{kind}:{index}",
            "strategy": strategy,
            "replicas": args.replicas,
            "cluster": cluster,
            "accuracy": accuracy,
            "loss": epoch_losses,
        }
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(summary))
        os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
