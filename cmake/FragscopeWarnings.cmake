# fragscope_set_warnings(target): the house warning set (docs: STYLE.md §9), -Werror when
# FRAGSCOPE_WERROR is on. Applied per target, never through CMAKE_CXX_FLAGS.
function(fragscope_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wold-style-cast>
    $<$<COMPILE_LANGUAGE:C>:-Wall -Wextra>)
  # GCC 12 at -O3 reports -Wrestrict inside libstdc++'s std::string inlines (GCC bug 105329,
  # a false positive); it is not about our code.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wno-restrict>)
    # Unity builds (CMakePresets.json) #include several .cc files into one; GCC then takes a
    # class of one file whose member's type is in another's anonymous namespace for a header
    # class and warns (-Wsubobject-linkage). Each .cc alone is fine, and the unity TU is
    # never included elsewhere.
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wno-subobject-linkage>)
  endif()
  if(FRAGSCOPE_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
