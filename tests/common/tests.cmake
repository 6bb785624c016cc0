fragscope_add_test(common/units_test.cc LIBS fragscope_common)
fragscope_add_test(common/prefaulter_test.cc LIBS fragscope_common)
fragscope_add_test(common/batch_pipe_test.cc LIBS fragscope_common)
fragscope_add_test(common/did_you_mean_test.cc LIBS fragscope_common)
