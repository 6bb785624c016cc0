fragscope_add_test(common/units_test.cc LIBS fragscope_common)
