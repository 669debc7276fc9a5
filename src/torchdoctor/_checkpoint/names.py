"""Exact global names, as data: what torch's weights-only unpickler allows, and torch's own classes.

Generated from torch 2.13.0+cpu (``torch._weights_only_unpickler._get_allowed_globals()``; the ``nn.Module``,
``Optimizer`` and ``LRScheduler`` classes torch exports, ``GradScaler``, ``Parameter``) so that reading a checkpoint
never imports torch. ``tests/checkpoint/test_allowlist.py`` checks these lists still cover the installed torch.
"""

from __future__ import annotations

__all__ = ["DATA_TYPES", "LIBRARY_CLASSES", "TORCH_CLASSES", "WEIGHTS_ONLY"]

WEIGHTS_ONLY = frozenset("""
    _codecs.encode builtins.bytearray builtins.complex builtins.set
    collections.Counter collections.OrderedDict torch.BFloat16Storage torch.BFloat16Tensor
    torch.BoolStorage torch.BoolTensor torch.ByteStorage torch.ByteTensor
    torch.CharStorage torch.CharTensor torch.ComplexDoubleStorage torch.ComplexFloatStorage
    torch.DoubleStorage torch.DoubleTensor torch.FloatStorage torch.FloatTensor
    torch.HalfStorage torch.HalfTensor torch.IntStorage torch.IntTensor
    torch.LongStorage torch.LongTensor torch.QInt32Storage torch.QInt8Storage
    torch.QUInt2x4Storage torch.QUInt4x2Storage torch.QUInt8Storage torch.ShortStorage
    torch.ShortTensor torch.Size torch.Tensor torch._tensor._rebuild_from_type_v2
    torch._utils._rebuild_device_tensor_from_cpu_tensor torch._utils._rebuild_device_tensor_from_numpy torch._utils._rebuild_meta_tensor_no_storage torch._utils._rebuild_nested_tensor
    torch._utils._rebuild_parameter torch._utils._rebuild_parameter_with_state torch._utils._rebuild_qtensor torch._utils._rebuild_sparse_tensor
    torch._utils._rebuild_tensor torch._utils._rebuild_tensor_v2 torch._utils._rebuild_tensor_v3 torch._utils._rebuild_wrapper_subclass
    torch.bfloat16 torch.bits16 torch.bits1x8 torch.bits2x4
    torch.bits4x2 torch.bits8 torch.bool torch.complex128
    torch.complex32 torch.complex64 torch.cuda.BFloat16Storage torch.cuda.BFloat16Tensor
    torch.cuda.BoolStorage torch.cuda.BoolTensor torch.cuda.ByteStorage torch.cuda.ByteTensor
    torch.cuda.CharStorage torch.cuda.CharTensor torch.cuda.ComplexDoubleStorage torch.cuda.ComplexFloatStorage
    torch.cuda.DoubleStorage torch.cuda.DoubleTensor torch.cuda.FloatStorage torch.cuda.FloatTensor
    torch.cuda.HalfStorage torch.cuda.HalfTensor torch.cuda.IntStorage torch.cuda.IntTensor
    torch.cuda.LongStorage torch.cuda.LongTensor torch.cuda.ShortStorage torch.cuda.ShortTensor
    torch.cuda.sparse.BFloat16Tensor torch.cuda.sparse.ByteTensor torch.cuda.sparse.CharTensor torch.cuda.sparse.DoubleTensor
    torch.cuda.sparse.FloatTensor torch.cuda.sparse.HalfTensor torch.cuda.sparse.IntTensor torch.cuda.sparse.LongTensor
    torch.cuda.sparse.ShortTensor torch.device torch.float16 torch.float32
    torch.float4_e2m1fn_x2 torch.float64 torch.float8_e4m3fn torch.float8_e4m3fnuz
    torch.float8_e5m2 torch.float8_e5m2fnuz torch.float8_e8m0fnu torch.int1
    torch.int16 torch.int2 torch.int3 torch.int32
    torch.int4 torch.int5 torch.int6 torch.int64
    torch.int7 torch.int8 torch.nn.parameter.Parameter torch.per_channel_affine
    torch.per_channel_affine_float_qparams torch.per_channel_symmetric torch.per_tensor_affine torch.per_tensor_symmetric
    torch.qint32 torch.qint8 torch.quint2x4 torch.quint4x2
    torch.quint8 torch.serialization._get_layout torch.sparse.BFloat16Tensor torch.sparse.ByteTensor
    torch.sparse.CharTensor torch.sparse.DoubleTensor torch.sparse.FloatTensor torch.sparse.HalfTensor
    torch.sparse.IntTensor torch.sparse.LongTensor torch.sparse.ShortTensor torch.storage.TypedStorage
    torch.storage.UntypedStorage torch.uint1 torch.uint16 torch.uint2
    torch.uint3 torch.uint32 torch.uint4 torch.uint5
    torch.uint6 torch.uint64 torch.uint7 torch.uint8
""".split())  # fmt: skip

TORCH_CLASSES = frozenset("""
    torch.amp.grad_scaler.GradScaler torch.cuda.amp.grad_scaler.GradScaler torch.nn.modules.activation.CELU torch.nn.modules.activation.ELU
    torch.nn.modules.activation.GELU torch.nn.modules.activation.GLU torch.nn.modules.activation.Hardshrink torch.nn.modules.activation.Hardsigmoid
    torch.nn.modules.activation.Hardswish torch.nn.modules.activation.Hardtanh torch.nn.modules.activation.LeakyReLU torch.nn.modules.activation.LogSigmoid
    torch.nn.modules.activation.LogSoftmax torch.nn.modules.activation.Mish torch.nn.modules.activation.MultiheadAttention torch.nn.modules.activation.PReLU
    torch.nn.modules.activation.RReLU torch.nn.modules.activation.ReLU torch.nn.modules.activation.ReLU6 torch.nn.modules.activation.SELU
    torch.nn.modules.activation.SiLU torch.nn.modules.activation.Sigmoid torch.nn.modules.activation.Softmax torch.nn.modules.activation.Softmax2d
    torch.nn.modules.activation.Softmin torch.nn.modules.activation.Softplus torch.nn.modules.activation.Softshrink torch.nn.modules.activation.Softsign
    torch.nn.modules.activation.Tanh torch.nn.modules.activation.Tanhshrink torch.nn.modules.activation.Threshold torch.nn.modules.adaptive.AdaptiveLogSoftmaxWithLoss
    torch.nn.modules.batchnorm.BatchNorm1d torch.nn.modules.batchnorm.BatchNorm2d torch.nn.modules.batchnorm.BatchNorm3d torch.nn.modules.batchnorm.LazyBatchNorm1d
    torch.nn.modules.batchnorm.LazyBatchNorm2d torch.nn.modules.batchnorm.LazyBatchNorm3d torch.nn.modules.batchnorm.SyncBatchNorm torch.nn.modules.channelshuffle.ChannelShuffle
    torch.nn.modules.container.Container torch.nn.modules.container.ModuleDict torch.nn.modules.container.ModuleList torch.nn.modules.container.ParameterDict
    torch.nn.modules.container.ParameterList torch.nn.modules.container.Sequential torch.nn.modules.conv.Conv1d torch.nn.modules.conv.Conv2d
    torch.nn.modules.conv.Conv3d torch.nn.modules.conv.ConvTranspose1d torch.nn.modules.conv.ConvTranspose2d torch.nn.modules.conv.ConvTranspose3d
    torch.nn.modules.conv.LazyConv1d torch.nn.modules.conv.LazyConv2d torch.nn.modules.conv.LazyConv3d torch.nn.modules.conv.LazyConvTranspose1d
    torch.nn.modules.conv.LazyConvTranspose2d torch.nn.modules.conv.LazyConvTranspose3d torch.nn.modules.distance.CosineSimilarity torch.nn.modules.distance.PairwiseDistance
    torch.nn.modules.dropout.AlphaDropout torch.nn.modules.dropout.Dropout torch.nn.modules.dropout.Dropout1d torch.nn.modules.dropout.Dropout2d
    torch.nn.modules.dropout.Dropout3d torch.nn.modules.dropout.FeatureAlphaDropout torch.nn.modules.flatten.Flatten torch.nn.modules.flatten.Unflatten
    torch.nn.modules.fold.Fold torch.nn.modules.fold.Unfold torch.nn.modules.instancenorm.InstanceNorm1d torch.nn.modules.instancenorm.InstanceNorm2d
    torch.nn.modules.instancenorm.InstanceNorm3d torch.nn.modules.instancenorm.LazyInstanceNorm1d torch.nn.modules.instancenorm.LazyInstanceNorm2d torch.nn.modules.instancenorm.LazyInstanceNorm3d
    torch.nn.modules.linear.Bilinear torch.nn.modules.linear.Identity torch.nn.modules.linear.LazyLinear torch.nn.modules.linear.Linear
    torch.nn.modules.loss.BCELoss torch.nn.modules.loss.BCEWithLogitsLoss torch.nn.modules.loss.CTCLoss torch.nn.modules.loss.CosineEmbeddingLoss
    torch.nn.modules.loss.CrossEntropyLoss torch.nn.modules.loss.GaussianNLLLoss torch.nn.modules.loss.HingeEmbeddingLoss torch.nn.modules.loss.HuberLoss
    torch.nn.modules.loss.KLDivLoss torch.nn.modules.loss.L1Loss torch.nn.modules.loss.LinearCrossEntropyLoss torch.nn.modules.loss.MSELoss
    torch.nn.modules.loss.MarginRankingLoss torch.nn.modules.loss.MultiLabelMarginLoss torch.nn.modules.loss.MultiLabelSoftMarginLoss torch.nn.modules.loss.MultiMarginLoss
    torch.nn.modules.loss.NLLLoss torch.nn.modules.loss.NLLLoss2d torch.nn.modules.loss.PoissonNLLLoss torch.nn.modules.loss.SmoothL1Loss
    torch.nn.modules.loss.SoftMarginLoss torch.nn.modules.loss.TripletMarginLoss torch.nn.modules.loss.TripletMarginWithDistanceLoss torch.nn.modules.module.Module
    torch.nn.modules.normalization.CrossMapLRN2d torch.nn.modules.normalization.GroupNorm torch.nn.modules.normalization.LayerNorm torch.nn.modules.normalization.LocalResponseNorm
    torch.nn.modules.normalization.RMSNorm torch.nn.modules.padding.CircularPad1d torch.nn.modules.padding.CircularPad2d torch.nn.modules.padding.CircularPad3d
    torch.nn.modules.padding.ConstantPad1d torch.nn.modules.padding.ConstantPad2d torch.nn.modules.padding.ConstantPad3d torch.nn.modules.padding.ReflectionPad1d
    torch.nn.modules.padding.ReflectionPad2d torch.nn.modules.padding.ReflectionPad3d torch.nn.modules.padding.ReplicationPad1d torch.nn.modules.padding.ReplicationPad2d
    torch.nn.modules.padding.ReplicationPad3d torch.nn.modules.padding.ZeroPad1d torch.nn.modules.padding.ZeroPad2d torch.nn.modules.padding.ZeroPad3d
    torch.nn.modules.pixelshuffle.PixelShuffle torch.nn.modules.pixelshuffle.PixelUnshuffle torch.nn.modules.pooling.AdaptiveAvgPool1d torch.nn.modules.pooling.AdaptiveAvgPool2d
    torch.nn.modules.pooling.AdaptiveAvgPool3d torch.nn.modules.pooling.AdaptiveMaxPool1d torch.nn.modules.pooling.AdaptiveMaxPool2d torch.nn.modules.pooling.AdaptiveMaxPool3d
    torch.nn.modules.pooling.AvgPool1d torch.nn.modules.pooling.AvgPool2d torch.nn.modules.pooling.AvgPool3d torch.nn.modules.pooling.FractionalMaxPool2d
    torch.nn.modules.pooling.FractionalMaxPool3d torch.nn.modules.pooling.LPPool1d torch.nn.modules.pooling.LPPool2d torch.nn.modules.pooling.LPPool3d
    torch.nn.modules.pooling.MaxPool1d torch.nn.modules.pooling.MaxPool2d torch.nn.modules.pooling.MaxPool3d torch.nn.modules.pooling.MaxUnpool1d
    torch.nn.modules.pooling.MaxUnpool2d torch.nn.modules.pooling.MaxUnpool3d torch.nn.modules.rnn.GRU torch.nn.modules.rnn.GRUCell
    torch.nn.modules.rnn.LSTM torch.nn.modules.rnn.LSTMCell torch.nn.modules.rnn.RNN torch.nn.modules.rnn.RNNBase
    torch.nn.modules.rnn.RNNCell torch.nn.modules.rnn.RNNCellBase torch.nn.modules.sparse.Embedding torch.nn.modules.sparse.EmbeddingBag
    torch.nn.modules.transformer.Transformer torch.nn.modules.transformer.TransformerDecoder torch.nn.modules.transformer.TransformerDecoderLayer torch.nn.modules.transformer.TransformerEncoder
    torch.nn.modules.transformer.TransformerEncoderLayer torch.nn.modules.upsampling.Upsample torch.nn.modules.upsampling.UpsamplingBilinear2d torch.nn.modules.upsampling.UpsamplingNearest2d
    torch.nn.parallel.data_parallel.DataParallel torch.nn.parameter.Buffer torch.nn.parameter.Parameter torch.nn.parameter.UninitializedBuffer
    torch.nn.parameter.UninitializedParameter torch.nn.utils.parametrize.ParametrizationList torch.optim.Adafactor torch.optim.Muon
    torch.optim.adadelta.Adadelta torch.optim.adagrad.Adagrad torch.optim.adam.Adam torch.optim.adamax.Adamax
    torch.optim.adamw.AdamW torch.optim.asgd.ASGD torch.optim.lbfgs.LBFGS torch.optim.lr_scheduler.ChainedScheduler
    torch.optim.lr_scheduler.ConstantLR torch.optim.lr_scheduler.CosineAnnealingLR torch.optim.lr_scheduler.CosineAnnealingWarmRestarts torch.optim.lr_scheduler.CyclicLR
    torch.optim.lr_scheduler.ExponentialLR torch.optim.lr_scheduler.LRScheduler torch.optim.lr_scheduler.LambdaLR torch.optim.lr_scheduler.LinearLR
    torch.optim.lr_scheduler.MultiStepLR torch.optim.lr_scheduler.MultiplicativeLR torch.optim.lr_scheduler.OneCycleLR torch.optim.lr_scheduler.PolynomialLR
    torch.optim.lr_scheduler.ReduceLROnPlateau torch.optim.lr_scheduler.SequentialLR torch.optim.lr_scheduler.StepLR torch.optim.lr_scheduler._LRScheduler
    torch.optim.nadam.NAdam torch.optim.optimizer.Optimizer torch.optim.radam.RAdam torch.optim.rmsprop.RMSprop
    torch.optim.rprop.Rprop torch.optim.sgd.SGD torch.optim.sparse_adam.SparseAdam
""".split())  # fmt: skip

# Plain data types, harmless to import and to call with data, that torch.load(weights_only=True) refuses: what
# real training checkpoints hold (argparse hyper-parameters, numpy scalars, arrays and random states, dates,
# paths, omegaconf configs). Exact names: ``pathlib.Path`` is here, ``pathlib.Path.touch`` is not.
_NP = ("numpy.core", "numpy._core")
DATA_TYPES = frozenset([
    "argparse.Namespace", "numpy.ndarray", "numpy.dtype", "numpy.random._pickle.__randomstate_ctor",
    "numpy.random._pickle.__bit_generator_ctor", "numpy.random._pickle.__generator_ctor",
    "numpy.random._mt19937.MT19937", "numpy.random._pcg64.PCG64", "numpy.random._philox.Philox",
    "numpy.random._sfc64.SFC64", "numpy.random.bit_generator.SeedSequence",
    "numpy.random.bit_generator.__pyx_unpickle_SeedSequence", "numpy.random.mtrand.RandomState",
    "numpy.random._generator.Generator",
    *(f"{m}.multiarray.{n}" for m in _NP for n in ("_reconstruct", "scalar")), *(f"{m}.numeric._frombuffer" for m in _NP),
    *(f"numpy.dtypes.{n}DType" for n in (
        "Bool", "Int8", "UInt8", "Int16", "UInt16", "Int32", "UInt32", "Int64", "UInt64", "Float16", "Float32",
        "Float64", "LongDouble", "Complex64", "Complex128", "Str", "Bytes", "Object", "Void", "DateTime64",
        "TimeDelta64")),
    "datetime.datetime", "datetime.date", "datetime.time", "datetime.timedelta", "datetime.timezone",
    "decimal.Decimal", "fractions.Fraction", "uuid.UUID", "collections.deque", "collections.defaultdict",
    "pathlib.Path", "pathlib.PosixPath", "pathlib.WindowsPath", "pathlib.PurePath", "pathlib.PurePosixPath",
    "pathlib.PureWindowsPath", "copyreg._reconstructor", "builtins.object", "builtins.int", "builtins.float",
    "builtins.str", "builtins.bool", "builtins.range", "builtins.list", "builtins.dict", "builtins.tuple",
    "builtins.frozenset", "builtins.slice", "builtins.bytes", "typing.Any",
    "omegaconf.dictconfig.DictConfig", "omegaconf.listconfig.ListConfig", "omegaconf.base.ContainerMetadata",
    "omegaconf.base.Metadata", "omegaconf.nodes.AnyNode", "omegaconf.nodes.StringNode",
    "omegaconf.nodes.IntegerNode", "omegaconf.nodes.FloatNode", "omegaconf.nodes.BooleanNode",
])  # fmt: skip

# Classes of training libraries found in real checkpoints (Lightning callbacks keyed by class, the Trainer's
# training_args.bin): rebuilt from their saved fields, they run none of the file's code.
_PL = ("pytorch_lightning", "lightning.pytorch")
LIBRARY_CLASSES = TORCH_CLASSES | frozenset([
    *(f"{p}.callbacks.{m}" for p in _PL for m in (
        "model_checkpoint.ModelCheckpoint", "early_stopping.EarlyStopping", "lr_monitor.LearningRateMonitor",
        "progress.tqdm_progress.TQDMProgressBar", "model_summary.ModelSummary")),
    "pytorch_lightning.utilities.parsing.AttributeDict", "lightning_fabric.utilities.data.AttributeDict",
    "lightning.fabric.utilities.data.AttributeDict",
    "transformers.training_args.TrainingArguments", "transformers.training_args.OptimizerNames",
    "transformers.trainer_utils.IntervalStrategy", "transformers.trainer_utils.SaveStrategy",
    "transformers.trainer_utils.HubStrategy", "transformers.trainer_utils.SchedulerType",
    "transformers.trainer_pt_utils.AcceleratorConfig", "accelerate.utils.dataclasses.DistributedType",
    "accelerate.state.PartialState", "accelerate.state.AcceleratorState", "accelerate.state.GradientState",
])  # fmt: skip
