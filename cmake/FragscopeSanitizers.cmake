# FRAGSCOPE_SANITIZE builds every target with AddressSanitizer and UndefinedBehaviorSanitizer.
# UBSan findings abort (-fno-sanitize-recover) so a test cannot pass over one.
if(FRAGSCOPE_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-sanitize-recover=undefined
                      -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
endif()
