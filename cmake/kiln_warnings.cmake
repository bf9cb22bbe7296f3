# Warnings and sanitizers shared by every kiln target.
add_library(kiln_warnings INTERFACE)
target_compile_options(kiln_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wimplicit-fallthrough>)
if(KILN_WERROR)
  target_compile_options(kiln_warnings INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
endif()
if(KILN_FUZZ)
  add_compile_options(-fsanitize=fuzzer-no-link)
  set(KILN_ASAN ON)
endif()
if(KILN_ASAN)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()

# kiln_library(NAME DEPS...): one library per src/ folder, sources globbed from that folder.
function(kiln_library name)
  # Paths relative to the folder, so that only its own cuda/ subfolders are left out (not a checkout whose
  # path names a `cuda` folder): CUDA code is added by its folder's CMakeLists, with KILN_CUDA only.
  file(GLOB_RECURSE srcs CONFIGURE_DEPENDS RELATIVE ${CMAKE_CURRENT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR}/*.cpp)
  list(FILTER srcs EXCLUDE REGEX "(^|/)cuda/")
  if(NOT srcs)
    message(FATAL_ERROR "${name}: no .cpp files in ${CMAKE_CURRENT_SOURCE_DIR}")
  endif()
  add_library(${name} STATIC ${srcs})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/include)
  target_link_libraries(${name} PUBLIC ${ARGN} PRIVATE kiln_warnings)
endfunction()
