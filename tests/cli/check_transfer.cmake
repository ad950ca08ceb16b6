# The CI-size transfer test (tests/cli/repro.cmake): runs the Fashion-MNIST -> MNIST plan with exact gradients,
# one seed and small subsets on the CPU, then reads results.csv: the fine-tuned run's final top-1 must beat the
# from-scratch run's.
#   cmake -DEXE=hadatrain -DOUT=dir -DMNIST=dir -DPLAN=plan.yaml -P check_transfer.cmake
cmake_policy(SET CMP0007 NEW)  # keep empty CSV fields, so columns counted from the end stay put
file(REMOVE_RECURSE ${OUT})
execute_process(
  COMMAND ${EXE} sweep --plan ${PLAN} --out-dir ${OUT} --only pretrain --only "*-exact-0"
          --set train.device=cpu --set data.num_workers=2 --set train.log_every=10
          --set data.test_limit=500 --set data.eval_batch_size=500 --set data.batch_size=64
          --set pretrain:data.train_limit=2048 --set pretrain:train.epochs=1
          --set finetune:data.train_limit=512 --set scratch:data.train_limit=512
          --set finetune:data.root=${MNIST} --set scratch:data.root=${MNIST}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("exit code ${rc}\n${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the sweep failed")
endif()
file(STRINGS ${OUT}/results.csv rows)
set(finetune "")
set(scratch "")
foreach(row ${rows})
  string(REPLACE "," ";" f "${row}")
  list(GET f 0 name)
  if(name MATCHES "^(finetune|scratch)-exact-0$")
    list(LENGTH f n)
    # columns: run,stage,<grid keys...>,status,epochs,steps,final_top1,...; final_top1 is the 8th from the end
    math(EXPR i "${n} - 7")
    list(GET f ${i} top1)
    set(${CMAKE_MATCH_1} ${top1})
  endif()
endforeach()
message("fine-tuned top-1 ${finetune} %, from scratch ${scratch} %")
if(finetune STREQUAL "" OR scratch STREQUAL "")
  message(FATAL_ERROR "results.csv lacks the finetune-exact-0 or scratch-exact-0 row")
endif()
if(NOT finetune GREATER scratch)
  message(FATAL_ERROR "the fine-tuned run (${finetune} %) does not beat the run from scratch (${scratch} %)")
endif()
