"""Which MXNet operators AMP leaves unlisted run in bfloat16 on CPU: generated, do not edit.

Written by ``python tools/amp_probe_ops.py > mxfp16/_amp_op_probe.py``, which runs each
operator in float32 and with bfloat16 inputs (forward and backward) and compares.
"""
#: The MXNet these verdicts were measured on.
MXNET_VERSION = '1.9.1'

#: Ran in bfloat16 and matched float32.
BFLOAT16 = {
    'ElementWiseSum',
    '_Div',
    '_Equal',
    '_Greater',
    '_Greater_Equal',
    '_Lesser',
    '_Lesser_Equal',
    '_Logical_And',
    '_Logical_Or',
    '_Logical_Xor',
    '_Maximum',
    '_Minimum',
    '_Minus',
    '_Mul',
    '_Not_Equal',
    '_Plus',
    '_contrib_arange_like',
    '_contrib_backward_gradientmultiplier',
    '_contrib_round_ste',
    '_contrib_sign_ste',
    '_div',
    '_equal',
    '_greater',
    '_greater_equal',
    '_lesser',
    '_lesser_equal',
    '_logical_and',
    '_logical_or',
    '_logical_xor',
    '_maximum',
    '_minimum',
    '_minus',
    '_mul',
    '_not_equal',
    '_plus',
    '_scatter_elemwise_div',
    '_sub',
    'add_n',
    'broadcast_add',
    'broadcast_div',
    'broadcast_equal',
    'broadcast_greater',
    'broadcast_greater_equal',
    'broadcast_lesser',
    'broadcast_lesser_equal',
    'broadcast_logical_and',
    'broadcast_logical_or',
    'broadcast_logical_xor',
    'broadcast_maximum',
    'broadcast_minimum',
    'broadcast_minus',
    'broadcast_not_equal',
    'broadcast_plus',
    'broadcast_sub',
    'cumsum',
    'elemwise_add',
    'elemwise_div',
    'elemwise_mul',
    'elemwise_sub',
    'stack',
    'where',
}

#: No bfloat16 path on CPU: failed, crashed or disagreed with float32.
FLOAT32 = {
    'Correlation',  # MXNetError: Unknown type enum 12
    '_Mod',  # bfloat16 gradient differs from float32 beyond bfloat16's precision
    '_contrib_MultiBoxPrior',  # MXNetError: Check failed: in_type->at(i) == mshadow: :default_type_flag || in_type->at(i) == -1: Unsupported data type 12
    '_contrib_box_iou',  # MXNetError: Unknown type enum 12
    '_mod',  # bfloat16 gradient differs from float32 beyond bfloat16's precision
    '_random_pdf_dirichlet',  # MXNetError: Unknown type enum 12
    '_random_pdf_exponential',  # MXNetError: Unknown type enum 12
    '_random_pdf_gamma',  # MXNetError: Unknown type enum 12
    '_random_pdf_generalized_negative_binomial',  # MXNetError: Unknown type enum 12
    '_random_pdf_negative_binomial',  # MXNetError: Unknown type enum 12
    '_random_pdf_normal',  # MXNetError: Unknown type enum 12
    '_random_pdf_poisson',  # MXNetError: Unknown type enum 12
    '_random_pdf_uniform',  # MXNetError: Unknown type enum 12
    'batch_dot',  # MXNetError: Check failed: outputs[0].type_flag_ == kFloat32 || outputs[0].type_flag_ == kFloat64 || (outputs[0].type_flag_ == kFloat16 && ctx.run_ctx.ctx.dev_ma
    'broadcast_mod',  # bfloat16 gradient differs from float32 beyond bfloat16's precision
    'dot',  # MXNetError: Check failed: outputs[0].type_flag_ == kFloat32 || outputs[0].type_flag_ == kFloat64 || (outputs[0].type_flag_ == kFloat16 && ctx.run_ctx.ctx.dev_ma
    'random_pdf_dirichlet',  # MXNetError: Unknown type enum 12
    'random_pdf_exponential',  # MXNetError: Unknown type enum 12
    'random_pdf_gamma',  # MXNetError: Unknown type enum 12
    'random_pdf_generalized_negative_binomial',  # MXNetError: Unknown type enum 12
    'random_pdf_negative_binomial',  # MXNetError: Unknown type enum 12
    'random_pdf_normal',  # MXNetError: Unknown type enum 12
    'random_pdf_poisson',  # MXNetError: Unknown type enum 12
    'random_pdf_uniform',  # MXNetError: Unknown type enum 12
}

#: No generic input ran them (they need set shapes, indices or parameters): float32 unless MXNet's lists say otherwise.
UNPROBED = {
    '_contrib_ModulatedDeformableConvolution',
    '_contrib_MultiBoxDetection',
    '_contrib_MultiBoxTarget',
    '_contrib_MultiProposal',
    '_contrib_Proposal',
    '_contrib_ROIAlign',
    '_contrib_RROIAlign',
    '_contrib_box_decode',
    '_contrib_box_encode',
    '_contrib_box_nms',
    '_contrib_box_non_maximum_suppression',
    '_contrib_edge_id',
    '_contrib_interleaved_matmul_encdec_qk',
    '_contrib_interleaved_matmul_encdec_valatt',
    '_contrib_interleaved_matmul_selfatt_qk',
    '_contrib_interleaved_matmul_selfatt_valatt',
    '_sg_mkldnn_selfatt_qk',
    '_sg_mkldnn_selfatt_valatt',
    'col2im',
    'im2col',
}

