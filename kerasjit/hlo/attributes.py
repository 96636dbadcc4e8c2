"""How each known HLO attribute is typed; any other attribute is kept as raw text."""
from dataclasses import dataclass

INT_LIST_ATTRS = frozenset("""dimensions lhs_batch_dims rhs_batch_dims lhs_contracting_dims
    rhs_contracting_dims offset_dims collapsed_slice_dims start_index_map slice_sizes
    update_window_dims inserted_window_dims scatter_dims_to_operand_dims
    dynamic_slice_sizes operand_batching_dims start_indices_batching_dims
    input_batching_dims scatter_indices_batching_dims""".split())
INT_ATTRS = frozenset("""index iota_dimension feature_group_count batch_group_count
    index_vector_dim exponent_bits mantissa_bits""".split())
COMPUTATION_ATTRS = frozenset("""to_apply select scatter calls condition body
    true_computation false_computation""".split())
COMPUTATION_LIST_ATTRS = frozenset({"branch_computations"})


@dataclass(frozen=True)
class DimLabels:
    """A convolution's dim_labels (`b01f_01io->b01f`): each operand's dims in
    order, as labels: "b" and "f" (batch, feature), "i" and "o" (the kernel's
    input and output features), spatial dims by their number."""
    lhs: tuple
    rhs: tuple
    out: tuple

    @classmethod
    def parse(cls, text):
        lhs, rest = text.split("_")
        rhs, out = rest.split("->")
        return cls(*(tuple(int(c) if c.isdigit() else c for c in part) for part in (lhs, rhs, out)))

    def __str__(self):
        lhs, rhs, out = ("".join(map(str, part)) for part in (self.lhs, self.rhs, self.out))
        return f"{lhs}_{rhs}->{out}"

    def positions(self):
        """Per operand (lhs, rhs, out): label -> its dim, e.g. {"b": 0, 0: 1, 1: 2, "f": 3}."""
        return tuple({label: i for i, label in enumerate(part)}
                     for part in (self.lhs, self.rhs, self.out))
