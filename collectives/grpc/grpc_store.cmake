# The gRPC Store server and client, added to tessel_collectives. With gRPC (TESSEL_HAVE_GRPC)
# store.proto is compiled into ${CMAKE_BINARY_DIR}/gen/tessel/collectives/grpc/; without it a
# stub is compiled whose constructors throw Unavailable and whose is_available() is false.
set(_store_dir ${CMAKE_CURRENT_LIST_DIR})
target_sources(tessel_collectives PRIVATE
  ${_store_dir}/../store_server.h
  ${_store_dir}/../store_client.h
  ${_store_dir}/../store_tls.h
  ${_store_dir}/store_env.cc)

if(TESSEL_HAVE_GRPC)
  set(_gen_root ${CMAKE_BINARY_DIR}/gen)
  set(_gen_dir ${_gen_root}/tessel/collectives/grpc)
  set(_gen_srcs ${_gen_dir}/store.pb.cc ${_gen_dir}/store.grpc.pb.cc)
  set(_gen_hdrs ${_gen_dir}/store.pb.h ${_gen_dir}/store.grpc.pb.h)
  file(MAKE_DIRECTORY ${_gen_dir})
  # --proto_path is the build include root, where "tessel" links to the source tree, so the
  # generated files include each other as "tessel/collectives/grpc/store.pb.h".
  add_custom_command(
    OUTPUT ${_gen_srcs} ${_gen_hdrs}
    COMMAND protobuf::protoc
      --proto_path=${TESSEL_BUILD_INCLUDE_DIR}
      --cpp_out=${_gen_root}
      --grpc_out=${_gen_root}
      --plugin=protoc-gen-grpc=${TESSEL_GRPC_CPP_PLUGIN}
      tessel/collectives/grpc/store.proto
    DEPENDS ${_store_dir}/store.proto
    COMMENT "Generating the Store service from store.proto"
    VERBATIM)
  target_sources(tessel_collectives PRIVATE
    ${_gen_srcs}
    ${_store_dir}/connection_gate.h ${_store_dir}/connection_gate.cc
    ${_store_dir}/server_auth.h ${_store_dir}/server_auth.cc
    ${_store_dir}/store_table.h ${_store_dir}/store_table.cc
    ${_store_dir}/store_service.h ${_store_dir}/store_service.cc
    ${_store_dir}/store_server.cc
    ${_store_dir}/store_client_channel.h ${_store_dir}/store_client.cc)
  target_include_directories(tessel_collectives PUBLIC $<BUILD_INTERFACE:${_gen_root}>)
  # Public: the internal headers (store_service.h) expose gRPC types to the launcher.
  target_link_libraries(tessel_collectives PUBLIC gRPC::grpc++ protobuf::libprotobuf)
else()
  target_sources(tessel_collectives PRIVATE ${_store_dir}/grpc_store_stub.cc)
endif()
