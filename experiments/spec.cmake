# The experiment YAML schema: loading, validation, sweep expansion. Included from
# experiments/CMakeLists.txt; no database, simulator or CUDA dependency.
add_library(twinstep_experiment_spec STATIC
  ${CMAKE_CURRENT_LIST_DIR}/experiment.cc
  ${CMAKE_CURRENT_LIST_DIR}/yaml_fields.cc
  ${CMAKE_CURRENT_LIST_DIR}/yaml_tree.cc
)
target_include_directories(twinstep_experiment_spec PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(twinstep_experiment_spec PUBLIC twinstep_policies ${TWINSTEP_YAML_TARGET})
