"""A stand-in for megatron.core.parallel_state: getters that hand out process groups the test chose."""

_groups: dict = {}


def set_groups(**groups):
    _groups.update(groups)


def model_parallel_is_initialized():
    return bool(_groups)


def get_pipeline_model_parallel_group(check_initialized=True):
    return _groups["pp"]


def get_tensor_model_parallel_world_size():
    return 1


def get_pipeline_model_parallel_world_size():
    return 1


def get_data_parallel_world_size():
    return 1
