fragscope_add_test(model/allocator_rules_test.cc LIBS fragscope_model)
fragscope_add_test(model/size_class_test.cc LIBS fragscope_model)
fragscope_add_test(model/device_memory_test.cc LIBS fragscope_model)
fragscope_add_test(model/random_replay_test.cc LIBS fragscope_analysis)
