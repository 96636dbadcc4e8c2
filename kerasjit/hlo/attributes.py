"""How each known HLO attribute is typed; any other attribute is kept as raw text."""
INT_LIST_ATTRS = frozenset("""dimensions lhs_batch_dims rhs_batch_dims lhs_contracting_dims
    rhs_contracting_dims offset_dims collapsed_slice_dims start_index_map slice_sizes
    update_window_dims inserted_window_dims scatter_dims_to_operand_dims
    dynamic_slice_sizes operand_batching_dims start_indices_batching_dims
    input_batching_dims scatter_indices_batching_dims""".split())
INT_ATTRS = frozenset("""index iota_dimension feature_group_count batch_group_count
    index_vector_dim exponent_bits mantissa_bits""".split())
COMPUTATION_ATTRS = frozenset("""to_apply select scatter calls condition body
    true_computation false_computation""".split())
